"""The live dashboard: GET /dashboard (a page that ships in this package) and GET /dashboard/events (server-sent
events, one record per engine step: scheduler/engine_view.py builds them, feed.py fans them out)."""
