"""Interoperability with other frameworks: Hugging Face ``transformers`` checkpoints (see ``hf.py``)."""

from multilevel.interop.hf import (CheckpointFileError, HFInteropError, MissingTensorError, TensorShapeError,
                                   UnexpectedTensorError, UnsupportedArchitectureError, UnsupportedConfigError,
                                   check_inputs, config_from_hf, from_hf_state_dict, load_hf, save_hf, save_inputs,
                                   supported_architectures, to_hf_config, to_hf_model, to_hf_state_dict)

__all__ = [
    "HFInteropError", "UnsupportedArchitectureError", "UnsupportedConfigError", "MissingTensorError",
    "UnexpectedTensorError", "TensorShapeError", "CheckpointFileError", "load_hf", "save_hf", "save_inputs",
    "check_inputs", "from_hf_state_dict", "to_hf_state_dict", "config_from_hf", "to_hf_config", "to_hf_model",
    "supported_architectures",
]
