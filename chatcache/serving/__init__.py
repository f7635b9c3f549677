"""`chatcache serve`: the bot as an OpenAI-compatible HTTP service with admission control and metrics."""

from .app import create_app
from .background import BackgroundServer
from .server import Server, build_server, served_model_id
from .settings import ServeSettings

__all__ = ["BackgroundServer", "Server", "ServeSettings", "build_server", "create_app", "served_model_id"]
