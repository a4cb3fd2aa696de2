"""callgate: observe, classify and review the tool calls of LLM agents."""

from callgate.celery import app as celery_app

__all__ = ["celery_app"]
