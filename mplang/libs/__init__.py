"""Protocols and applications written in MPLang."""
