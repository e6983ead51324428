"""One model, written by the tests and by tasks."""

from django.db import models


class Note(models.Model):
    text = models.CharField(max_length=200)

    class Meta:
        app_label = "shop"
