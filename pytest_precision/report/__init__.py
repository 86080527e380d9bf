"""Report: renderers that turn results (data) into text, JSON, CSV and HTML.

Results never import their renderers; the plugin, the CLI and a user pass a result here.
"""
