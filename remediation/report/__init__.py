"""Output formats, one module each: console tables, JSON, JUnit XML, Prometheus textfile, incident Markdown."""
