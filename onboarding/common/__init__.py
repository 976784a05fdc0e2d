"""Small helpers every stage shares: errors, names, paths, files, tables, plots, refs, child processes, config files. Imports no other onboarding package."""
