"""The run's record: metrics.jsonl cut back on resume, TensorBoard events hidden past the same point."""

import glob
import os
import struct

from multilevel.metrics import MetricsWriter, read_metrics


def _events(logdir):
  """Every event of every events file under ``logdir``, in TensorBoard's order (TFRecord framing, read by hand)."""
  from tensorboardX.proto import event_pb2
  out = []
  for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):  # TensorBoard's order: by name.
    with open(path, "rb") as f:
      data = f.read()
    i = 0
    while i < len(data):
      (n,) = struct.unpack("<Q", data[i:i + 8])
      ev = event_pb2.Event()
      ev.ParseFromString(data[i + 12:i + 12 + n])
      out.append(ev)
      i += 12 + n + 4
  return out


def _visible(events, tag):
  """What TensorBoard shows for ``tag``: a session START at step s hides the earlier points at steps >= s."""
  points = []
  for ev in events:
    if ev.HasField("session_log") and ev.session_log.status == ev.session_log.START:
      points = [p for p in points if p[0] < ev.step]
    for v in ev.summary.value:
      if v.tag == tag:
        points.append((ev.step, round(v.simple_value, 4)))
  return points


def test_resume_cuts_jsonl_and_hides_tensorboard_events_after_the_checkpoint(tmp_path):
  w = MetricsWriter(str(tmp_path))
  w.truncate(0)
  for step in range(1, 11):
    w.write({"step": step, "train_loss": float(step)})
  w.close()
  # Resume from a checkpoint taken after the fifth record: steps 6.. are logged again, with other values.
  w = MetricsWriter(str(tmp_path))
  w.truncate(5)
  assert w.count == 5
  for step in range(6, 9):
    w.write({"step": step, "train_loss": step + 0.5})
  w.close()
  assert [r["train_loss"] for r in read_metrics(str(tmp_path))] == [1, 2, 3, 4, 5, 6.5, 7.5, 8.5]
  shown = _visible(_events(os.path.join(tmp_path, "tensorboard")), "train_loss")
  assert shown == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 5.0), (6, 6.5), (7, 7.5), (8, 8.5)]


def test_resume_says_when_the_records_before_the_checkpoint_are_gone(tmp_path, caplog):
  w = MetricsWriter(str(tmp_path), tensorboard=False)
  w.truncate(0)
  for step in range(1, 4):
    w.write({"step": step})
  w.close()
  os.remove(os.path.join(tmp_path, "metrics.jsonl"))  # Deleted by hand; the checkpoint counts 3 records.
  w = MetricsWriter(str(tmp_path), tensorboard=False)
  with caplog.at_level("WARNING"):
    w.truncate(3)
  assert w.count == 0
  assert any("holds 0 records where the checkpoint resumed from counts 3" in r.getMessage() for r in caplog.records)
  caplog.clear()
  w.write({"step": 4})
  w.truncate(1)  # Nothing missing: no warning.
  w.close()
  assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_a_resume_at_a_transition_shows_its_evaluations_once_under_their_own_tags(tmp_path):
  w = MetricsWriter(str(tmp_path))
  w.truncate(0)
  w.write({"step": 3, "level": 1, "train_loss": 6.0, "eval_loss": 5.9, "event": "end_of_stage"})
  w.write({"step": 3, "level": 0, "eval_loss": 6.3, "event": "after_decoalesce"})  # Logged, then the run is killed.
  w.close()
  w = MetricsWriter(str(tmp_path))  # The checkpoint was taken before the transition: one record kept ...
  w.truncate(1)
  w.write({"step": 3, "level": 0, "eval_loss": 6.3, "event": "after_decoalesce"})  # ... the transition runs again.
  w.write({"step": 5, "level": 0, "train_loss": 5.5, "eval_loss": 5.4})
  w.close()
  events = _events(os.path.join(tmp_path, "tensorboard"))
  assert _visible(events, "eval_loss/after_decoalesce") == [(3, 6.3)]  # Once (it was shown twice).
  assert _visible(events, "eval_loss") == [(3, 5.9), (5, 5.4)]  # The curve: no untrained model's loss on it.
  assert _visible(events, "train_loss") == [(3, 6.0), (5, 5.5)]


def test_the_targets_evaluations_are_also_shown_against_flops_and_cut_back_on_resume(tmp_path):
  w = MetricsWriter(str(tmp_path))
  w.truncate(0)
  w.write({"step": 2, "level": 0, "flops": 100e9, "train_loss": 7.0, "eval_loss": 6.9, "event": "end_of_stage"})
  w.write({"step": 2, "level": 1, "eval_loss": 7.1, "event": "after_coalesce"})  # Never trained: not a point.
  w.write({"step": 6, "level": 1, "flops": 140e9, "train_loss": 6.0, "eval_loss": 5.9})  # The small model's.
  w.write({"step": 6, "level": 0, "eval_loss": 6.3, "event": "after_decoalesce"})
  w.write({"step": 8, "level": 0, "flops": 240e9, "train_loss": 5.5, "eval_loss": 5.4, "eval_accuracy": 0.5})
  w.close()
  w = MetricsWriter(str(tmp_path))  # Resumed from a checkpoint after the third record.
  w.truncate(3)
  w.write({"step": 6, "level": 0, "eval_loss": 6.3, "event": "after_decoalesce"})
  w.write({"step": 8, "level": 0, "flops": 240e9, "train_loss": 5.6, "eval_loss": 5.3, "eval_accuracy": 0.6})
  w.close()
  events = _events(os.path.join(tmp_path, "tensorboard", "by_flops"))
  assert _visible(events, "eval_loss") == [(100, 6.9), (240, 5.3)]
  assert _visible(events, "eval_accuracy") == [(240, 0.6)]
  assert _visible(events, "train_loss") == []  # Evaluations only.
  assert _visible(_events(os.path.join(tmp_path, "tensorboard")), "eval_loss") == [(2, 6.9), (6, 5.9), (8, 5.3)]
  # In GFLOPs, as floats: a paper-size run's 1e20 FLOPs overflowed TensorBoard's int64 steps and int conversion.
  os.makedirs(tmp_path / "big")
  w = MetricsWriter(str(tmp_path / "big"))
  w.write({"step": 20, "level": 0, "flops": int(2.7e20), "eval_loss": 1.9})
  w.close()
  assert _visible(_events(os.path.join(tmp_path, "big", "tensorboard", "by_flops")), "eval_loss") == [(int(2.7e11), 1.9)]


def test_a_line_cut_short_at_the_end_is_left_out_and_a_damaged_one_is_named(tmp_path):
  import pytest
  path = os.path.join(tmp_path, "metrics.jsonl")
  with open(path, "w", encoding="utf-8") as f:
    f.write('{"step": 1, "train_loss": 2.0}\n{"step": 2, "train_lo')
  assert read_metrics(str(tmp_path)) == [{"step": 1, "train_loss": 2.0}]
  with open(path, "w", encoding="utf-8") as f:
    f.write('{"step": 1, "train_lo\n{"step": 2, "train_loss": 2.0}\n')
  with pytest.raises(ValueError, match=r"metrics.jsonl, line 1, is not a JSON record .* Delete that line"):
    read_metrics(str(tmp_path))
  for tensorboard in (True, False):  # Without TensorBoard the damaged line was kept as a record (a real one cut).
    w = MetricsWriter(str(tmp_path), tensorboard=tensorboard)
    with pytest.raises(ValueError, match=r"metrics.jsonl, record 1, is not a JSON record"):
      w.truncate(2)


def test_each_record_reaches_the_file_as_it_is_logged(tmp_path):
  w = MetricsWriter(str(tmp_path), tensorboard=False)
  w.write({"step": 1, "eval_loss": 3.0})
  assert read_metrics(str(tmp_path)) == [{"step": 1, "eval_loss": 3.0}]  # Before any flush: a run in progress.
  w.close()
