"""Several front-end processes behind one ``turnpool serve`` address (``--frontends N``).

One event loop carries every session's frames, and past a few thousand steps per second that
loop is the server's ceiling. With ``frontends=N`` the ``turnpool serve`` process becomes a
supervisor (``supervisor.FrontGroup``) of N front processes (``process``, each running what
``spec`` says). Each runs the whole single-process server (the app, the ``/ws`` path, a slot
engine) over its own share of the pool's workers and slots, and listens on the same host and
port with ``SO_REUSEPORT``, so the kernel spreads new connections over them. What no single
front can see is settled between them over Unix sockets in a private directory, one module
per part, put together by `link.FrontLink` with its dependencies given (it holds no
reference to the server):

* **Placement by cost** (``placement``). Each front publishes, ten times a second, its load
  (the measured step cost of the slots its sessions hold:
  `turnpool.pool.slots.SlotEngine.measured_load`), its sessions and its free slots in a
  small shared file. A front that accepts a new ``/ws`` session while another front carries
  less by over half a session's cost, or while it has no free slot, passes the connection
  to the least loaded front, by the cost model the slot engine leases by
  (`turnpool.pool.cost`). So a front whose sessions step an expensive env takes fewer new
  sessions, not the same count.
* **Socket passing** (``passing``): the socket's descriptor and the bytes read so far, over
  a Unix datagram socket (``SCM_RIGHTS``); the receiver serves it as if it had accepted it.
* **Sessions by id** (``routing``). A session id names its front (``f<k>-<hex>``). A
  WebSocket attaching to a session that another front holds is passed to that front the
  same way; an HTTP or MCP request for it (the path of every routed served verb,
  ``routing.ROUTED_PATHS``: ``/step``, ``/fork``, ``/mcp``, ...) is proxied to the owner's
  private HTTP socket.
* **One server to look at** (``merge``). ``/api/status`` and ``/metrics`` answer for the
  whole server: the front that gets the request asks the others (``?local=1``) and merges
  their answers (sums, workers and metrics labelled by ``front``).

Seeds: front ``k`` holds slots ``k*m .. k*m+m-1`` of an ``N*m``-slot server (its pool's base
seed is ``seed + k*m``), so a seeded reset gives the episode it gives on one front, and
seedless ones do not repeat across fronts. The supervisor restarts a front that dies (its
sessions end, as in a server restart); fronts end with the supervisor; `FrontGroup.stop`
ends them, and their workers, and removes the directory.
"""

from __future__ import annotations

from turnpool.serve.fronts.link import FrontLink
from turnpool.serve.fronts.merge import merge_metrics, merge_status
from turnpool.serve.fronts.placement import owner_of
from turnpool.serve.fronts.process import run_front
from turnpool.serve.fronts.routing import ROUTED_HEADER, Router
from turnpool.serve.fronts.spec import FrontSpec, front_settings
from turnpool.serve.fronts.supervisor import FrontGroup

__all__ = ["ROUTED_HEADER", "FrontGroup", "FrontLink", "FrontSpec", "Router",
           "front_settings", "merge_metrics", "merge_status", "owner_of", "run_front"]
