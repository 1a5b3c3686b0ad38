"""Triton Python-backend entry point of every hf2triton model. It parses nothing itself: the
serving core beside it (hf2triton_serving/, the code the release's gate ran on this version's
files) reads the requests and answers them, as serving.json says."""

import json
import os
import sys

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        # args["model_repository"] is this model's own directory (not the repository root).
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        sys.path.insert(0, version_dir)
        import hf2triton_serving

        self.serving = hf2triton_serving
        # A KIND_GPU instance runs on the GPU Triton chose for it.
        gpu = (
            int(args["model_instance_device_id"])
            if args.get("model_instance_kind") == "GPU"
            else None
        )
        # Its CPU threads share the host's cores with the model's other instances.
        instances = hf2triton_serving.instances_in(json.loads(args.get("model_config", "{}")))
        self.model = hf2triton_serving.load(version_dir, gpu=gpu, instances=instances)

    def execute(self, requests):
        return self.serving.triton_execute(self.model, requests, pb_utils)

    def finalize(self):
        # A model with a background decode loop (text generation) stops it.
        getattr(self.model, "close", lambda: None)()
