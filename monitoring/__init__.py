"""Dashboards and alerts for trainingjob-operator, and the generator of the monitoring component's
PrometheusRule (`python -m monitoring.generate`). Not part of the installed package."""
