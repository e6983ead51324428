"""No views: the project only enqueues and runs tasks."""

urlpatterns: list[object] = []
