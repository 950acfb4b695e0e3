"""Generic helpers with no MPLang concepts: nothing here imports the rest of the package."""
