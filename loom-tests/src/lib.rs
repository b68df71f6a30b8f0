//! Empty library: the models live in `tests/` and compile only under `--cfg proxalloc_loom`.
