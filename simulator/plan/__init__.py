"""Planning on top of run/: layouts of a base scenario and the space searched
(space.py), scenario edits (planning.py), the closed-form memory filter and iteration
bound (bound.py), the search with pruning (search.py) and its journal (records.py),
the planning questions (questions.py: fit, fewest nodes, time to train, scaling;
goodput.py: restarts and failures), sweeps (sweep.py), executors (serial, processes,
Ray) and the answers' tables (answers.py). No files, no simpy."""
