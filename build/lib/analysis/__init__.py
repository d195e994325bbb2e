"""Reading finished runs and turning them into tables, plots and per-head studies."""
