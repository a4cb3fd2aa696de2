"""callgate: observe, classify and review the tool calls of LLM agents.

Importing the package imports nothing else, so that the pure modules (``wire``,
``providers``, ``taxonomy``, ``classification``, ``lifecycle``, ``lint``) load without
Django. The Celery application (``callgate.celery``) is loaded by ``CallgateConfig.ready``
when Django starts, and found by ``celery -A callgate`` as the ``callgate.celery`` module.
"""
