"""`bench/offline.py`'s helpers: the evaluation both sides share (`episodes`, numpy and gymnasium
only), the datasets (`datasets`: the .npz export, hand-made datasets) and d3rlpy's side
(`d3rlpy_worker`, run as a script in the d3rlpy venv). A folder of their own: the top-level
scripts of bench/ each write JSON and take --help, these are not scripts of that kind."""
