"""``turnpool view PATH``: a web page over what turnpool writes (rollout ``--out`` JSONL or
Parquet, ``--record`` files, ``--tree-out`` trees), served on 127.0.0.1.

files.py   reads a file (its kind told from its content) into episodes, turn by turn
boards.py  boards as PNG where the env draws ``rgb_array`` (a frame hook, or a checked replay)
app.py     the page's routes and JSON (FastAPI; the ``serve`` extra)
server.py  the listening socket and uvicorn, in the foreground or on a thread (tests)
static/    the page: plain HTML, JS and CSS, no build step, nothing fetched from outside

Nothing here imports the web stack at package import, so `files` and `boards` work without
the ``serve`` extra.
"""
