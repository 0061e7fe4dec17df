"""npumanager.nn."""

# Compilation caching helpers (owned by the cache engineer).
from npumanager.nn.cache_files import cache_file_names as cache_file_names
from npumanager.nn.token import driver_token as driver_token
