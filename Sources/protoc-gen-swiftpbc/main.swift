print("protoc-gen-swiftpbc: not built yet")
