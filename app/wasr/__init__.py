"""whisper-asr-webservice's API on Murmur's jobs (views.py)."""
