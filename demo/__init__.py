"""The demo: a simulated agent fleet (``demo.fleet``) and a failure-injecting target system
(``demo.simulator``), with their commands ``manage.py demo`` and ``manage.py simulator``.
Not part of the product: installed only when ``CALLGATE_DEMO`` is on (default: ``DEBUG``)."""
