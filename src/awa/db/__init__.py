"""Database layer: pool and codecs, named SQL, migrations, error translation."""
