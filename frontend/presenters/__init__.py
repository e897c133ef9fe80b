"""Presenters: what a page shows, loaded and shaped for its template (views stay thin)."""
