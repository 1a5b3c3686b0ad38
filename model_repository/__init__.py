"""Triton model repository templates (model.py, config.pbtxt.template): package data of
hf2triton, read through importlib.resources (hf2triton.util.workspace.resource_dir)."""
