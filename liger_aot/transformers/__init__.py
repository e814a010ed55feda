"""Hugging Face integration: modules, functionals and model patching."""
