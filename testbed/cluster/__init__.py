"""Many engine replicas behind a router: routers, KV transfer links, the simulated cluster, the HTTP front end."""
