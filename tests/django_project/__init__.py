"""A small Django project that uses Awa as its task backend (tests/test_django_backend.py)."""
