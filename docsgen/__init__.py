"""The generated reference pages of the documentation site, written from the code.

`python -m docsgen` rewrites every page in PAGES from what the code says now: the
command lines from the real argument parsers, the HTTP APIs from the shipped OpenAPI
documents, the metrics from the services' registries, the configuration from both,
and the database tables from each backend's schema statements.
`python -m docsgen --check` writes nothing and exits 1, naming each page that differs
(one line on stderr each), so that a reference cannot drift from the code.

Each page comes out the same on every machine: no time, no path, no terminal width,
nothing from the environment (OUTBOX_* variables and $USER are set aside while the
parsers are built, since options take their defaults from them).
"""
