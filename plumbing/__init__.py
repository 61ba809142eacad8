"""What both services need around the wire contract: CLI conventions, HTTP helpers,
network and token checks, storage errors and locations, throttled logs, OpenAPI."""
