"""Shared infrastructure: seeding, configs, results, statistics, plotting, progress, data and tiny nets."""
