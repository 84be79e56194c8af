"""Configuration: settings.py holds AppConfig (one frozen section per package), the service's own settings,
the presets and load_config's layers (defaults, preset, TOML file, PAGEDSERVE_* variables, flags); command.py
gives each command one flag per setting and sets up the log; setting_docs.py says each setting in words and
settings_table.py prints docs/CONFIG.md's table of them (`python -m service.config.settings_table`). It
imports nothing else of service/, and every other part may import it."""
