"""What the saving benchmark runs, as data: the benchmark models (``MODELS``: small enough to train to about 40
tokens per parameter on 2 CPU cores) and the named variants (``VARIANTS``: V-cycle settings on top of the paper's
protocol, and the other growth methods at their documented defaults, ``METHODS``). ``benchmarks.saving``,
``benchmarks.gpu`` and the tests read them from here."""

# Named variants: explicit overrides on top of the paper's protocol ("reference"), so that changing the config
# defaults never changes what a variant means.
REFERENCE = {"cycle.transition_warmup_frac": 0.0, "cycle.preln_exact": False, "cycle.depth_growth": "copy"}
_W = {"cycle.transition_warmup_frac": 0.05}
_ZERO = {**_W, "cycle.preln_exact": True, "cycle.depth_growth": "zero"}
VARIANTS = {
    "reference": {},
    "warmup": _W,
    "warmup_exact": {**_W, "cycle.preln_exact": True},
    "width_only": {**_W, "cycle.depth_factor": 1, "cycle.preln_exact": True},
    # Smaller jumps (about 2x the non-embedding parameters per level instead of 8x): depth only, 2 or 3 levels.
    "depth_only": {**_ZERO, "cycle.width_factor": 1},
    "depth_only_3": {**_ZERO, "cycle.width_factor": 1, "cycle.levels": 3},
    # The same with the exact hand-over (no interpolation: depth growth by the zero rule keeps the function and leaves
    # no width copies to tell apart), width only with split noise, and depth then width (the benchmark's 2 heads:
    # an identity width scheme at the first transition, an identity depth scheme at the second).
    "depth_only_w0": {**_ZERO, "cycle.width_factor": 1, "cycle.w_pre": 0.0},
    "depth_only_copy_w0": {**_W, "cycle.width_factor": 1, "cycle.preln_exact": True, "cycle.depth_growth": "copy",
                           "cycle.w_pre": 0.0},  # Plain copies (G_stack's rule) instead of the zero rule.
    "depth_only_3_w0": {**_ZERO, "cycle.width_factor": 1, "cycle.levels": 3, "cycle.w_pre": 0.0},
    # The planner's schedule at about 21 tokens/param on GPT (gcide, WSD; plan_gcide_gpt_wsd_1400_fresh.json) as a
    # hand-set variant for budgets that have no plan: the depth-only model from its own init for 79% of T at 2x the
    # LR, then the target for 23%.
    "depth_only_fresh": {**_ZERO, "cycle.width_factor": 1, "cycle.w_pre": 0.0, "cycle.small_init": "fresh",
                         "cycle.small_frac": 0.79, "cycle.up_fracs": (0.23, 0.25, 0.25),
                         "cycle.lr_scales": (1.0, 2.0, 2.0)},
    "width_only_split": {**_W, "cycle.depth_factor": 1, "cycle.preln_exact": True, "cycle.w_pre": 0.0,
                         "cycle.split_noise": 0.1},
    "alternating_split": {**_ZERO, "cycle.levels": 3, "cycle.width_schemes": "[[[0], [1]], null]",
                          "cycle.depth_schemes": "[null, [[0], [1]]]", "cycle.w_pre": 0.0, "cycle.split_noise": 0.1},
    "depth_zero": _ZERO,
    "reference_depth_only": {"cycle.width_factor": 1},  # The paper's protocol halving depth only (BERT: copy growth).
    # w_pre = 0 without split noise: the grown width copies stay tied (a control; vcycle refuses it otherwise).
    "depth_zero_w0": {**_ZERO, "cycle.w_pre": 0.0, "cycle.allow_tied_copies": True},
    "depth_zero_long": {**_ZERO, "cycle.up_fracs": (0.8, 0.25, 0.25)},
    "depth_zero_s25": {**_ZERO, "cycle.small_frac": 0.25, "cycle.up_fracs": (0.75, 0.25, 0.25)},
    "depth_zero_carry": {**_ZERO, "cycle.optimizer_policy": "carry"},
    "depth_zero_tail": {**_ZERO, "cycle.final_schedule": "baseline_tail"},
    "depth_zero_3": {**_ZERO, "cycle.levels": 3},
    "depth_zero_lr2": {**_ZERO, "cycle.lr_scales": (1.0, 2.0, 2.0)},  # Small level at 2x the LR, not 4x.
    "depth_zero_lr1": {**_ZERO, "cycle.lr_scales": (1.0, 1.0, 1.0)},
    "depth_zero_d20": {**_ZERO, "cycle.down_fracs": (0.2, 0.2, 0.2)},  # Longer first big stage (5% -> 20%).
    "depth_zero_d0": {**_ZERO, "cycle.down_fracs": (0.01, 0.01, 0.01)},  # Coalesce almost at once.
    # Function-preserving symmetry breaking instead of (or with) interpolation: operators.split_noise.
    "depth_zero_split": {**_ZERO, "cycle.w_pre": 0.0, "cycle.split_noise": 0.1},
    "depth_zero_split5": {**_ZERO, "cycle.w_pre": 0.0, "cycle.split_noise": 0.5},
    "depth_zero_split_tail": {**_ZERO, "cycle.w_pre": 0.0, "cycle.split_noise": 0.1,
                              "cycle.final_schedule": "baseline_tail"},
    "depth_zero_split_carry": {**_ZERO, "cycle.w_pre": 0.0, "cycle.split_noise": 0.1,
                               "cycle.optimizer_policy": "carry"},
    "depth_zero_split_warm20": {**_ZERO, "cycle.w_pre": 0.0, "cycle.split_noise": 0.1,
                                "cycle.transition_warmup_frac": 0.2},  # Longer warm-up after each transition.
    "depth_zero_split_top05": {**_ZERO, "cycle.w_pre": 0.0, "cycle.split_noise": 0.1,
                               "cycle.lr_scales": (0.5, 4.0, 4.0)},  # The big model at half the peak LR.
    "depth_zero_w0_lr2": {**_ZERO, "cycle.w_pre": 0.0, "cycle.lr_scales": (1.0, 2.0, 2.0),
                          "cycle.allow_tied_copies": True},
    # muP's per-parameter rates at the small level instead of 4x everywhere; shrink and perturb at growth. (A WSD
    # comparison runs scratch with WSD too: --set train.decay=wsd, with any variant.)
    "depth_zero_mup": {**_ZERO, "cycle.lr_rule": "mup", "cycle.lr_scales": (1.0, 1.0, 1.0)},
    "depth_zero_sp": {**_ZERO, "cycle.shrink_perturb": (0.9, 0.1)},
    # The adaptive small stage (cycles/switch.py): up to T small steps, ended where the small model pays as much per
    # nat as the target's frontier (--frontier_from) says the target would, then the target's 50% plus what the
    # unused small steps would have cost; w_pre = 0 + split noise (a lossless hand-over).
    "depth_zero_adaptive": {**_ZERO, "cycle.w_pre": 0.0, "cycle.split_noise": 0.1, "cycle.small_stop": "frontier",
                            "cycle.small_frac": 1.0},
    "depth_scaled": {**_W, "cycle.preln_exact": True, "cycle.depth_growth": "scaled"},
    "stride": {**_W, "cycle.depth_mode": "stride"},
    "control": {**_W, "cycle.restart_control": True},
}
VARIANTS = {k: {**REFERENCE, **v} for k, v in VARIANTS.items()}
_SB_LONG = {"cycle.method": "stackbert", "cycle.stackbert.fracs": (0.2, 0.3, 0.5)}
_SB_LONGER = {"cycle.method": "stackbert", "cycle.stackbert.fracs": (0.3, 0.3, 0.4)}
# The other growth methods at their documented defaults (multilevel/cycles/<method>.py), on the same benchmark.
METHODS = {
    "gstack": {"cycle.method": "gstack"},  # g = 4: a 1-layer small model for the 4-layer benchmark models.
    "gstack_g2": {"cycle.method": "gstack", "cycle.gstack.factor": 2},
    "stackbert": {"cycle.method": "stackbert"},
    # Longer shallow stages than the published 12.5 / 17.5% (the stacked GPT ends below scratch with 70% left).
    "stackbert_long": _SB_LONG,
    "stackbert_longer": _SB_LONGER,
    # The same with the copies' residual outputs halved (a smaller jump at each doubling), or each block repeated in
    # place.
    "stackbert_long_scaled": {**_SB_LONG, "cycle.stackbert.growth": "scaled"},
    "stackbert_long_adjacent": {**_SB_LONG, "cycle.stackbert.order": "adjacent"},
    "stackbert_long_scaled_adjacent": {**_SB_LONG, "cycle.stackbert.growth": "scaled",
                                       "cycle.stackbert.order": "adjacent"},
    "stackbert_longer_scaled": {**_SB_LONGER, "cycle.stackbert.growth": "scaled"},
    "stackbert_2stage": {"cycle.method": "stackbert", "cycle.stackbert.stages": 2, "cycle.stackbert.fracs": (0.4, 0.6)},
    "gstack_g2_30": {"cycle.method": "gstack", "cycle.gstack.factor": 2, "cycle.gstack.growth_frac": 0.3},
    "mslt": {"cycle.method": "mslt"},
    # 20 operator steps: LiGO's 100 are 0.025% of its 400k-step runs; 20 are 1.4-10% of these budgets.
    "ligo": {"cycle.method": "ligo", "cycle.ligo.operator_steps": 20},
    "ligo100": {"cycle.method": "ligo"},  # The paper's 100 operator steps (7% of T=1400).
    "ligo_depth": {"cycle.method": "ligo", "cycle.ligo.operator_steps": 20, "cycle.ligo.width_factor": 1},
    "msg": {"cycle.method": "msg"},
    "msg_layers": {"cycle.method": "msg", "cycle.msg.order": ("layers",)},  # Depth only: the MSG that LLaMA can run.
    "core": {"cycle.method": "core"},
}
VARIANTS.update(METHODS)

# Benchmark models: small enough to train to ~40 tokens per parameter on 2 CPU cores.
MODELS = {
    "gpt": {"model.num_layers": 4, "model.num_heads": 2, "model.head_dim": 32, "model.max_len": 128,
            "data.vocab_size": 1024, "train.batch_size": 32, "train.lr": 2e-3},
    "bert": {"model.num_layers": 4, "model.num_heads": 2, "model.head_dim": 32, "model.max_len": 128,
             "data.vocab_size": 1024, "train.batch_size": 32, "train.lr": 2e-3},
    "deit": {"model.num_layers": 4, "model.num_heads": 2, "model.head_dim": 32, "model.patch_size": 4,
             "train.batch_size": 128, "train.lr": 2e-3},
    # GPT's size with LLaMA's parts: two query heads on one key/value head, SwiGLU about 8/3 d wide.
    "llama": {"model.num_layers": 4, "model.num_heads": 2, "model.head_dim": 32, "model.num_kv_heads": 1,
              "model.ffn_size": 172, "model.max_len": 128, "data.vocab_size": 1024, "train.batch_size": 32,
              "train.lr": 2e-3},
}
