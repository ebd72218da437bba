"""Routes that change the gateway's state: admin keys only (app/api/security.py)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from app.api.security import require_admin_key
from app.api.state import GatewayState, gateway_state

router = APIRouter(dependencies=[Depends(require_admin_key)])


@router.post("/admin/drain")
async def drain(request: Request, state: GatewayState = Depends(gateway_state)) -> JSONResponse:
    """What SIGTERM does (e.g. from a Kubernetes preStop hook): stop admitting, let
    the requests in flight finish, then exit."""
    request.app.state.drain()
    return JSONResponse({"draining": True, "requests_in_flight": state.busy()}, status_code=202)
