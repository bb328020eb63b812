"""The Hugging Face import's refusals: another architecture, an unsupported setting, a missing, unexpected or
mis-shaped tensor, an untied head, a bad path or override. Each raises its own ``HFInteropError`` naming what is
wrong, before anything is half-loaded. Tiny random models (tests/hf_util.py); nothing is downloaded."""

import jax
import numpy as np
import pytest

from tests.hf_util import TEXT, VISION, I, M, bert_config, gpt_config, make, torch, transformers


def test_other_architectures_are_rejected():
  with pytest.raises(I.UnsupportedArchitectureError, match="BertForSequenceClassification"):
    I.load_hf(transformers.BertForSequenceClassification(bert_config()))
  roberta = transformers.RobertaForMaskedLM(transformers.RobertaConfig(**TEXT, vocab_size=64))
  with pytest.raises(I.UnsupportedArchitectureError, match="RobertaForMaskedLM"):
    I.load_hf(roberta)
  with pytest.raises(I.UnsupportedArchitectureError, match="model_type 'roberta'"):
    I.load_hf(roberta.state_dict(), config=roberta.config.to_dict())  # No architectures recorded.
  with pytest.raises(I.UnsupportedArchitectureError, match="does not match model_type"):
    I.config_from_hf({"architectures": ["BertForMaskedLM"], "model_type": "gpt2"})
  gpt = make("gpt")  # GPT-2 weights under a BERT config: caught by the architecture, never half-loaded.
  with pytest.raises(I.HFInteropError):
    I.load_hf(gpt.state_dict(), config=bert_config(), architecture="BertForMaskedLM")


def test_missing_tensor_is_an_error():
  model = make("bert")
  sd = dict(model.state_dict())
  del sd["bert.encoder.layer.1.attention.self.key.bias"]
  with pytest.raises(I.MissingTensorError, match=r"bert\.encoder\.layer\.1\.attention\.self\.key\.bias"):
    I.load_hf(sd, config=model.config)
  base = transformers.BertModel(bert_config())  # The encoder alone: no MLM head.
  with pytest.raises(I.MissingTensorError, match=r"cls\.predictions"):
    I.load_hf(base.state_dict(), config=bert_config(), architecture="BertForMaskedLM")
  vit = make("vit")
  sd = {k: v for k, v in vit.state_dict().items() if not k.startswith("classifier.")}
  with pytest.raises(I.MissingTensorError, match="classifier"):
    I.load_hf(sd, config=vit.config)


def test_unexpected_tensor_is_an_error():
  model = make("gpt")
  sd = dict(model.state_dict())
  sd["transformer.h.2.ln_1.weight"] = sd["transformer.h.1.ln_1.weight"]  # A third layer the config does not have.
  with pytest.raises(I.UnexpectedTensorError, match=r"transformer\.h\.2\.ln_1\.weight"):
    I.load_hf(sd, config=model.config)
  deit = make("deit")
  sd = dict(deit.state_dict())
  sd["classifier.weight"] = sd["cls_classifier.weight"]
  with pytest.raises(I.UnexpectedTensorError, match="classifier.weight"):
    I.load_hf(sd, config=deit.config)


def test_shape_mismatch_is_an_error():
  model = make("bert")
  sd = dict(model.state_dict())
  sd["bert.embeddings.position_embeddings.weight"] = torch.zeros(32, 32)
  with pytest.raises(I.TensorShapeError, match=r"position_embeddings.*\(32, 32\).*\(16, 32\)"):
    I.load_hf(sd, config=model.config)
  with pytest.raises(I.TensorShapeError, match="word_embeddings"):  # Config says another vocabulary size.
    I.load_hf(model.state_dict(), config=bert_config(vocab_size=100))
  with pytest.raises(I.TensorShapeError):  # Config says another FFN width.
    I.load_hf(make("vit").state_dict(), config=transformers.ViTConfig(**{**VISION, "intermediate_size": 64}))


def test_untied_lm_head_is_an_error():
  model = make("gpt")
  sd = dict(model.state_dict())
  sd["lm_head.weight"] = sd["lm_head.weight"] + 1.0
  with pytest.raises(I.UnsupportedConfigError, match="untied"):
    I.load_hf(sd, config=model.config)
  with pytest.raises(I.UnsupportedConfigError, match="tie_word_embeddings"):
    I.config_from_hf(gpt_config(tie_word_embeddings=False))
  bert = make("bert")
  sd = dict(bert.state_dict())
  sd["cls.predictions.decoder.weight"] = torch.zeros_like(sd["cls.predictions.decoder.weight"])
  with pytest.raises(I.UnsupportedConfigError, match="untied"):
    I.load_hf(sd, config=bert.config)


@pytest.mark.parametrize("change,match", [
    ({"hidden_act": "relu"}, "Activation 'relu'"),
    ({"num_attention_heads": 5}, "not divisible"),
    ({"intermediate_size": 100}, "not a multiple"),
    ({"position_embedding_type": "relative_key"}, "relative position"),
    ({"is_decoder": True}, "is_decoder"),
    ({"add_cross_attention": True}, "cross-attention"),
])
def test_unsupported_bert_settings(change, match):
  d = {**bert_config().to_dict(), **change}
  with pytest.raises(I.UnsupportedConfigError, match=match):
    I.config_from_hf(d)


@pytest.mark.parametrize("family,change,match", [
    ("gpt", {"activation_function": "relu"}, "Activation 'relu'"),
    ("gpt", {"activation_function": "gelu"}, "Activation 'gelu'"),  # exact gelu: our GPT uses the tanh form
    ("gpt", {"n_head": 3}, "not divisible"),
    ("gpt", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
    ("vit", {"hidden_act": "gelu_new"}, "Activation 'gelu_new'"),
    ("vit", {"image_size": [8, 12]}, "square"),
    ("vit", {"image_size": 10}, "not a multiple"),
    ("vit", {"id2label": {}, "num_labels": 0}, "num_labels=0"),
])
def test_unsupported_gpt_and_vision_settings(family, change, match):
  base = gpt_config().to_dict() if family == "gpt" else transformers.ViTConfig(**VISION).to_dict()
  with pytest.raises(I.UnsupportedConfigError, match=match):
    I.config_from_hf({**base, **change})


def test_bad_paths_and_overrides(tmp_path):
  with pytest.raises(I.HFInteropError, match="neither a directory nor a file"):
    I.load_hf("google-bert/bert-base-uncased")  # A hub name is not downloaded.
  with pytest.raises(I.HFInteropError, match="No weights"):
    I.load_hf(tmp_path)
  with pytest.raises(I.HFInteropError, match="No Hugging Face config"):
    I.load_hf({"x": np.zeros(1)})
  with pytest.raises(I.HFInteropError, match="num_layers"):
    I.load_hf(make("gpt"), num_layers=3)
  cfg = M.preset("gpt-test")
  params = jax.tree_util.tree_map(np.asarray, M.init_params(cfg, 0))
  with pytest.raises(I.TensorShapeError, match="shapes do not match the config"):
    I.save_hf(cfg.replace(num_layers=3), params, tmp_path / "x")
