print("interop-server: not built yet")
