"""Code written for the Tinker API runs on rlkit: a local Tinker-compatible HTTP service over one Session.

    service = TinkerService(session).start()          # or: rlkit serve-tinker CONFIG [overrides]
    client = tinker.ServiceClient(base_url=service.base_url, api_key=service.api_key)

Modules: :mod:`~rlkit.tinker_api.server` (start, stop, bind, API key), :mod:`~rlkit.tinker_api.service` (the
routes), :mod:`~rlkit.tinker_api.backend` (what each call does to the Session), :mod:`~rlkit.tinker_api.convert`
(datums <-> Trajectories), :mod:`~rlkit.tinker_api.losses` (Tinker's losses), :mod:`~rlkit.tinker_api.wire`
(protobuf bodies), :mod:`~rlkit.tinker_api.futures` (request ids and polling). docs/howto/tinker.md says what is
served and what differs.
"""

from rlkit.tinker_api.losses import TINKER_LOSSES, TinkerLoss
from rlkit.tinker_api.server import TinkerService

__all__ = ["TINKER_LOSSES", "TinkerLoss", "TinkerService"]
