"""Evaluating policies: which policy of a run (`policies`), episodes (`episodes`), `aiorl eval`
(`evaluate`, `options`) and the process evaluations during training run in (`worker`)."""
