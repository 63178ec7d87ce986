from rest_framework import serializers

from console.jobs.models import Job, JobCapture, PathEvent, WeightVersion


class JobSerializer(serializers.ModelSerializer):
    class Meta:
        model = Job
        fields = ["id", "organization", "cluster", "node", "name", "generation", "world_size", "step",
                  "step_time_s", "ranks", "last_seen", "created"]
        read_only_fields = fields


class JobCaptureSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobCapture
        fields = ["id", "organization", "cluster", "job", "kind", "identifier", "step", "bytes", "paused_s",
                  "duration_s", "path", "taken_at", "undiscovered"]
        read_only_fields = fields


class WeightVersionSerializer(serializers.ModelSerializer):
    class Meta:
        model = WeightVersion
        fields = ["id", "organization", "cluster", "job", "publisher", "version", "bytes", "duration_s",
                  "replicas", "holders", "pushed_at"]
        read_only_fields = fields


class PathEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = PathEvent
        fields = ["id", "organization", "cluster", "node", "kind", "comm", "rank", "from_device", "to_device",
                  "reason", "ts"]
        read_only_fields = fields
