"""Reports for managers: ``selectors`` (the numbers, from rollups), ``rollups`` (the hourly
pre-aggregates and their refresh task), ``views`` (the pages) and ``api`` (the same numbers
as JSON under ``/api/v1/reports/…``)."""
