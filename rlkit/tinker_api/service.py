"""The HTTP side of rlkit's Tinker service: the routes the ``tinker`` SDK's training and sampling clients call.

Every route is under ``/api/v1`` and needs the service's API key in the ``X-API-Key`` header (the SDK sends the
``api_key`` it was given, or ``$TINKER_API_KEY``). The SDK first asks ``/client/config`` for its feature flags; the
answer keeps it on the plain protocol: API keys (no JWT exchange), httpx's transport, uncompressed protobuf bodies,
one ``retrieve_future`` poll per request, custom losses computed on the client side.

One client session at a time: ``create_session`` while another session is alive (a heartbeat or request within
``SESSION_TIMEOUT_S``, and not finished) answers 409 with a message that says which and how to free it. The SDK's
``ServiceClient.close()`` (or leaving its ``with`` block) finishes a session.

Errors: a route the service does not implement answers 501 naming it, with ``x-should-retry: false`` so the SDK
raises at once instead of retrying; the training routes the SDK sends through its own five-minute retry loop
(``save_weights_external``, ``create_custom_loss``) answer instead with a
future that fails with the same message, which the SDK raises as ``RequestFailedError`` on ``.result()``. A request
the service refuses (an unknown loss, a datum it cannot convert, a model it does not serve) fails its future with
the reason and the fix.
"""

# no `from __future__ import annotations`: FastAPI reads the routes' annotations (Request) at definition
import secrets
import threading
import time
import uuid
from typing import Any, Optional

from rlkit.tinker_api.backend import TinkerBackend
from rlkit.tinker_api.convert import TinkerRequestError
from rlkit.tinker_api.futures import TRY_AGAIN, FutureStore
from rlkit.tinker_api.wire import PROTOBUF, decode_forward_backward

SESSION_TIMEOUT_S = 60.0  # the SDK heartbeats every 10 s
NOT_RETRYABLE = {"x-should-retry": "false"}
# routes the SDK wraps in its own retry loop: refused as failed futures (a 501 would be retried for minutes)
FUTURE_ROUTES_REFUSED = ("save_weights_external", "create_custom_loss")
CLIENT_CONFIG = {"pjwt_auth_enabled": False, "use_pyqwest_transport": False, "proto_compress_fwdbwd": False,
                 "parallel_fwdbwd_chunks": False, "sample_use_retrieve_futures": False,
                 "custom_loss_server_side": False, "sample_join_sampling_session": False}


def new_api_key() -> str:
    """A key the SDK accepts (it checks for the ``tml-`` prefix)."""
    return f"tml-rlkit-{secrets.token_hex(16)}"


def not_implemented(route: str) -> str:
    return (f"{route} is not implemented by rlkit's Tinker service (rlkit serve-tinker); docs/howto/tinker.md lists "
            "what it serves")


class ClientSessions:
    """The one client session the service serves, and when it was last heard from."""

    def __init__(self, timeout_s: float = SESSION_TIMEOUT_S):
        self.timeout_s = timeout_s
        self.active: Optional[str] = None
        self.last_seen = 0.0
        self._lock = threading.Lock()

    def open(self) -> str:
        """A new session id; raises ``RuntimeError`` with the reason when another session is alive."""
        with self._lock:
            now = time.monotonic()
            if self.active is not None and now - self.last_seen < self.timeout_s:
                raise RuntimeError(
                    f"rlkit's Tinker service serves one client at a time, and session {self.active} is active (heard "
                    f"from {now - self.last_seen:.0f} s ago): close that ServiceClient (service_client.close(...) or "
                    f"leave its with-block), or wait {self.timeout_s:.0f} s after it stops")
            self.active, self.last_seen = f"rlkit-session-{uuid.uuid4().hex[:12]}", now
            return self.active

    def touch(self, session_id: str) -> bool:
        with self._lock:
            if session_id != self.active:
                return False
            self.last_seen = time.monotonic()
            return True

    def finish(self, session_id: str) -> None:
        with self._lock:
            if session_id == self.active:
                self.active = None


def _tokens(model_input: dict) -> list[int]:
    tokens: list[int] = []
    for chunk in model_input.get("chunks", []):
        if chunk.get("type", "encoded_text") != "encoded_text":
            raise TinkerRequestError(f"prompt chunk {chunk.get('type')!r} is not served: token chunks only")
        tokens.extend(int(t) for t in chunk["tokens"])
    return tokens


def build_app(backend: TinkerBackend, api_key: str, futures: FutureStore, sessions: ClientSessions) -> Any:
    """The FastAPI app of the service."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response

    app = FastAPI(title="rlkit Tinker service", docs_url=None, redoc_url=None, openapi_url=None)

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"detail": message}, status_code=status, headers=NOT_RETRYABLE)

    @app.middleware("http")
    async def authenticate(request: Request, call_next):
        if request.url.path != "/api/v1/healthz" and not secrets.compare_digest(
                request.headers.get("x-api-key", ""), api_key):
            return error(401, "missing or wrong API key: pass the key rlkit serve-tinker printed as "
                              "ServiceClient(api_key=...) or $TINKER_API_KEY")
        return await call_next(request)

    def future(work, what: str) -> dict:
        return {"request_id": futures.submit(work, what)}

    # ---- the session and its configuration ------------------------------------------------------------
    @app.get("/api/v1/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.post("/api/v1/client/config")
    async def client_config():
        return CLIENT_CONFIG

    @app.post("/api/v1/client/dynamic_config")
    async def client_dynamic_config():
        return {"refresh_interval_sec": 3600, "sample_cancel_enabled": False}

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities():
        length = backend.session.config.policy.max_total_sequence_length
        return {"supported_models": [{"model_name": name, "max_context_length": length, "trainable": True,
                                      "sampleable": True} for name in backend.model_names()]}

    @app.post("/api/v1/create_session")
    async def create_session(request: Request):
        try:
            session_id = sessions.open()
        except RuntimeError as e:
            return error(409, str(e))
        return {"type": "create_session", "session_id": session_id,
                "info_message": f"rlkit Tinker service over {backend.base_model}"}

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat(request: Request):
        body = await request.json()
        if not sessions.touch(body.get("session_id", "")):
            return error(410, f"session {body.get('session_id')!r} is not active on this service")
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish(session_id: str):
        sessions.finish(session_id)
        return {}

    # ---- training ----------------------------------------------------------------------------------------
    @app.post("/api/v1/create_model")
    async def create_model(request: Request):
        body = await request.json()
        sessions.touch(body.get("session_id", ""))
        return future(lambda: backend.create_model(body["base_model"], body.get("lora_config"),
                                                   body.get("optimizer_config") or {}), "create_model")

    @app.post("/api/v1/get_info")
    async def get_info(request: Request):
        body = await request.json()
        try:
            return backend.info(body["model_id"])
        except TinkerRequestError as e:
            return error(404, str(e))

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request):
        if PROTOBUF not in request.headers.get("content-type", "") or request.headers.get("content-encoding"):
            return error(415, "forward_backward takes an uncompressed protobuf body (the SDK's, with the flags "
                              "/client/config gives)")
        try:
            call = decode_forward_backward(await request.body())
        except TinkerRequestError as e:
            return {"request_id": futures.failed(f"forward_backward: {e}")}
        what = "forward" if call.forward_only else "forward_backward"
        return future(lambda: backend.forward_backward(call), what)

    @app.post("/api/v1/optim_step")
    async def optim_step(request: Request):
        body = await request.json()
        adam = body.get("adam_params")
        if adam is None:
            return {"request_id": futures.failed(f"optim_step: only Adam's parameters are served (types.AdamParams), "
                                                 f"not {body.get('optimizer_params')!r}")}
        return future(lambda: backend.optim_step(body["model_id"], adam), "optim_step")

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_weights_for_sampler(request: Request):
        body = await request.json()
        return future(lambda: backend.save_for_sampler(body["model_id"], body.get("path"), body.get("seq_id")),
                      "save_weights_for_sampler")

    @app.post("/api/v1/save_weights")
    async def save_weights(request: Request):
        body = await request.json()
        return future(lambda: backend.save_state(body["model_id"], body.get("path"), bool(body.get("overwrite"))),
                      "save_state")

    @app.post("/api/v1/load_weights")
    async def load_weights(request: Request):
        body = await request.json()
        return future(lambda: backend.load_state(body), "load_state")

    for route in FUTURE_ROUTES_REFUSED:
        def refused(route: str = route):
            return {"request_id": futures.failed(not_implemented(f"/api/v1/{route}"))}
        app.post(f"/api/v1/{route}")(refused)

    # ---- sampling ----------------------------------------------------------------------------------------
    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request):
        body = await request.json()
        sessions.touch(body.get("session_id", ""))
        try:
            sampler_id = backend.new_sampler(body.get("base_model"), body.get("model_path"), None)
        except TinkerRequestError as e:
            return error(400, str(e))
        return {"type": "create_sampling_session", "sampling_session_id": sampler_id}

    @app.get("/api/v1/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str):
        try:
            sampler = backend.sampler(sampler_id)
        except TinkerRequestError as e:
            return error(404, str(e))
        return {"sampler_id": sampler_id, "base_model": sampler.base_model, "model_path": sampler.model_path}

    @app.post("/api/v1/asample")
    async def asample(request: Request):
        body = await request.json()
        n = int(body.get("num_samples", 1))
        sampler_id = body.get("sampling_session_id")
        if sampler_id is None:  # sampling by model_path / base_model without a session
            try:
                sampler_id = backend.new_sampler(body.get("base_model"), body.get("model_path"), None)
            except TinkerRequestError as e:
                return error(400, str(e))
        unsupported = [k for k in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k")
                       if body.get(k)] + [k for k in ("target_prompt_logprobs", "prompt_logprobs_last_n") if
                                          body.get(k) is not None]
        if unsupported:
            request_id = futures.failed(f"sample: {', '.join(unsupported)} not served by rlkit's Tinker service")
        else:
            try:
                prompt = _tokens(body["prompt"])
            except TinkerRequestError as e:
                prompt, request_id = None, futures.failed(f"sample: {e}")
            if prompt is not None:
                request_id = futures.submit(lambda: backend.sample(sampler_id, prompt, n, body["sampling_params"],
                                                                   bool(body.get("prompt_logprobs"))), "sample")
        return {"request_id": request_id, "sample_sequence_ids": [f"{request_id}-{i}" for i in range(n)]}

    # ---- futures -----------------------------------------------------------------------------------------
    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(request: Request):
        body = await request.json()
        request_id = body.get("request_id", "")
        if not futures.known(request_id):
            return error(404, f"unknown request_id {request_id!r}")
        result = await futures.result(request_id)
        if result is TRY_AGAIN:
            return {"type": "try_again", "request_id": request_id, "queue_state": "active"}
        if isinstance(result, bytes):
            return Response(result, media_type=PROTOBUF)
        return result

    # ---- everything else: 501, named ---------------------------------------------------------------------
    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def unimplemented(path: str, request: Request):
        return error(501, not_implemented(f"{request.method} /{path}"))

    return app
