"""Tests of the Kubernetes deployment: chart, manifests, image, rules and dashboard."""
