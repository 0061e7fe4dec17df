"""npumanager.cache: the nnCache-style BlobCache utility and the driver's verifier map."""

from npumanager.cache.blobcache import BlobCache, ClockScheduler, Scheduler, ThreadScheduler
from npumanager.cache.verifier import CacheEntry, CacheVerifier, verifier_dir

__all__ = [
    "BlobCache",
    "CacheEntry",
    "CacheVerifier",
    "ClockScheduler",
    "Scheduler",
    "ThreadScheduler",
    "verifier_dir",
]
