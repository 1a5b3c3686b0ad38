"""The release steps behind the Prefect tasks: export, candidates, the accuracy gate, the
Triton repository, the configuration search, the release record and its reports."""
