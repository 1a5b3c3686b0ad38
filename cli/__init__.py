"""The `hf2triton` command, above the release flow and the library it uses."""
