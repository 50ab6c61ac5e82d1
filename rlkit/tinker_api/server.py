"""Start and stop rlkit's Tinker service: uvicorn in a background thread (a notebook keeps its cells) or in the
foreground (``rlkit serve-tinker``).

It listens on 127.0.0.1 unless a host is named; any other host warns, since the API key is then all that stands
between the network and the session (the key travels in clear over plain HTTP). The key is ``$TINKER_API_KEY``
when that is set (so an SDK client in the same environment finds it by itself), else a new one, printed at start.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any, Optional

from rlkit.tinker_api.backend import TinkerBackend
from rlkit.tinker_api.futures import FutureStore
from rlkit.tinker_api.service import ClientSessions, build_app, new_api_key
from rlkit.tinker_api.wire import check_schema

if TYPE_CHECKING:
    from rlkit.session import Session

LOOPBACK = ("127.0.0.1", "localhost", "::1")


class TinkerService:
    """A Tinker-compatible HTTP service over one rlkit Session.

        service = TinkerService(session).start()
        client = tinker.ServiceClient(base_url=service.base_url, api_key=service.api_key)
    """

    def __init__(self, session: Session, host: str = "127.0.0.1", port: int = 0, api_key: Optional[str] = None):
        check_schema()
        if host not in LOOPBACK:
            warnings.warn(f"rlkit's Tinker service will listen on {host}, beyond this machine: anyone who can reach "
                          "it and has the API key can train and sample the session (plain HTTP)", stacklevel=2)
        self.session, self.host, self.port = session, host, port
        self.api_key = api_key or os.environ.get("TINKER_API_KEY") or new_api_key()
        self.backend = TinkerBackend(session)
        self.futures = FutureStore()
        self.sessions = ClientSessions()
        self._server: Any = None
        self._thread: Optional[threading.Thread] = None

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "localhost") else self.host
        return f"http://{host}:{self.port}"

    def _config(self) -> Any:
        import uvicorn

        if self.port == 0:
            with socket.socket() as probe:
                probe.bind((self.host, 0))
                self.port = probe.getsockname()[1]
        app = build_app(self.backend, self.api_key, self.futures, self.sessions)
        return uvicorn.Config(app, host=self.host, port=self.port, log_level="warning", lifespan="off")

    def start(self) -> "TinkerService":
        """Serve in a background thread; returns once the port accepts connections."""
        import uvicorn

        if self._thread is not None:
            return self
        self._server = uvicorn.Server(self._config())
        self._thread = threading.Thread(target=self._server.run, daemon=True, name="rlkit-tinker-service")
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"rlkit's Tinker service did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        return self

    def serve(self) -> None:
        """Serve in the foreground until Ctrl-C (``rlkit serve-tinker``)."""
        import uvicorn

        self._server = uvicorn.Server(self._config())
        print(f"rlkit Tinker service on {self.base_url} over {self.backend.base_model}\n"
              f"  export TINKER_BASE_URL={self.base_url}\n  export TINKER_API_KEY={self.api_key}", flush=True)
        try:
            self._server.run()
        finally:
            self.close()

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            if self._thread is not None:
                self._thread.join(timeout=10)
        self._server, self._thread = None, None
        self.futures.close()
        self.backend.close()

    def __enter__(self) -> "TinkerService":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "serving" if self._thread is not None else "stopped"
        return f"TinkerService({self.base_url}, {state}, model {self.backend.base_model})"
