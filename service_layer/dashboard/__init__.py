"""The admin dashboard: server-rendered pages, refreshed in place by a little vanilla JS."""
