"""What runs the system (Dockerfile, serving requirements, Kubernetes templates, set-up
scripts): package data of hf2triton where the code reads it at run time, through
importlib.resources (hf2triton.util.workspace.resource_dir)."""
