"""The only code that talks to Docker or a registry: the engine, the registry client, verify, the build pipeline."""
