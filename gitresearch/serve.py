"""`gitresearch serve`: a live, read-only web page over the repo's git data (docs/serve.md).

    gitresearch serve                 # http://127.0.0.1:8765
    gitresearch serve --port 9000 --host 0.0.0.0   # other machines too: they can read everything

The page polls /api/state every POLL_S seconds and reads again when best, an experiment ref or
a notes ref moved, so a running loop shows up without a reload. Every route is a GET; the page
writes every string it got (descriptions, diffs, logs) as text, never as HTML, under a content
security policy that runs no inline script.
"""
from __future__ import annotations

import re
from importlib import resources as importlib_resources
from pathlib import Path

from . import export, report
from .config import Config, load
from .gitstore import GitError, Store
from .notes import note_text
from .resources import web_dir

POLL_S = 2.0  # seconds between the page's checks for new notes
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
STATIC = {"app.js": "text/javascript", "style.css": "text/css", "index.html": "text/html"}


def experiments(store: Store) -> list[dict]:
    """One row per experiment, oldest first: what the table and the chart show."""
    chain = set(store.best_chain())
    rows = []
    for exp in reversed(store.experiments()):
        record = exp.record or {}
        rows.append({"number": exp.number, "commit": exp.commit, "status": record.get("status", "running"),
                     "value": record.get("val_bpb"), "delta": record.get("delta"),
                     "description": record.get("description") or exp.description,
                     "seconds": record.get("seconds"), "training_seconds": record.get("training_seconds"),
                     "finished": record.get("finished"), "policy": record.get("policy"),
                     "forecast": ((record.get("checks") or [{}])[-1] or {}).get("mean"),
                     "min_delta": record.get("min_delta"), "in_best": exp.commit in chain,
                     "confirmed": (record.get("confirmation") or {}).get("verdict")})
    return rows


def experiment(store: Store, config: Config, number: int) -> dict:
    """One experiment: its record, diff, learning curve and early-stop checks."""
    commit = store.experiment_commit(number)
    if commit is None:
        raise GitError(f"no experiment #{number}")
    record = store.read_note(commit) or {}
    return {"number": number, "commit": commit, "message": store.message(commit), "record": record,
            "readable": note_text(record) if record else "",
            "diff": store.diff_of(commit) if number else "", "checks": record.get("checks") or [],
            "curve": export.run_curve(store, number, config.metric.name)}


def app(root: Path, host: str = "127.0.0.1"):
    """The Starlette app over the research repo at `root`. Each request opens the repo afresh
    (a pygit2 repository is not shared between the server's threads)."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    Store(root)  # fail now, not at the first request, outside a repo
    static = web_dir()

    def headers(extra: dict | None = None) -> dict:
        return {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "no-referrer", "Cache-Control": "no-store", **(extra or {})}

    def as_json(data) -> JSONResponse:
        return JSONResponse(data, headers=headers())

    def page(request):
        return Response((static / "index.html").read_bytes(), media_type="text/html", headers=headers())

    def asset(request):
        name = request.path_params["name"]
        if name == "plotly.min.js":
            body = plotly_js()
        elif name in STATIC and name != "index.html":
            body = (static / name).read_bytes()
        else:
            return Response("not found", status_code=404, headers=headers())
        return Response(body, media_type=STATIC.get(name, "text/javascript"), headers=headers())

    def state(request):
        store = Store(root)
        return as_json({"token": store.state_token(), "poll_s": POLL_S, "root": str(root)})

    def summary(request):
        store, config = Store(root), load(root)
        data = report.summarise(store, config)
        return as_json({**data, "token": store.state_token(), "metric": config.metric.name})

    def table(request):
        store = Store(root)
        return as_json({"token": store.state_token(), "experiments": experiments(store)})

    def one(request):
        try:
            return as_json(experiment(Store(root), load(root), int(request.path_params["number"])))
        except GitError as err:
            return JSONResponse({"error": str(err)}, status_code=404, headers=headers())

    def no_icon(request):
        return Response(status_code=204, headers=headers())

    routes = [Route("/", page), Route("/favicon.ico", no_icon), Route("/static/{name}", asset), Route("/api/state", state),
              Route("/api/summary", summary), Route("/api/experiments", table),
              Route("/api/experiments/{number:int}", one)]  # GET (and HEAD) only: anything else is 405
    loopback = ["127.0.0.1", "localhost", "[::1]", "::1"]
    allowed = ["*"] if host not in loopback else [*loopback, host]
    # a page on another site cannot reach the server through a rebound name: Host is checked
    return Starlette(routes=routes, middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=allowed)])


def plotly_js() -> bytes:
    """plotly.js as the plotly package ships it: the chart library with no download."""
    return (importlib_resources.files("plotly") / "package_data" / "plotly.min.js").read_bytes()


def serve(root: Path, host: str, port: int, echo=print) -> None:
    import uvicorn

    if not re.fullmatch(r"[0-9A-Za-z.:\-\[\]]+", host):
        raise GitError(f"not a host name or address: {host!r}")
    application = app(root, host)
    echo(f"serving {root} read-only at http://{host if ':' not in host else f'[{host}]'}:{port}/ (Ctrl-C stops)")
    uvicorn.run(application, host=host, port=port, log_level="warning")
