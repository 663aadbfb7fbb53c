"""Model profiles shipped as TOML package data (read by specchat.profiles)."""
