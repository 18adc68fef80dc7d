import Testing

@testable import RPCCore

@Suite struct HeaderNameTests {
    @Test func classifiesWhatTheProtocolReserves() {
        let expected: [(String, HeaderName)] = [
            (":path", .path), (":method", .method), (":authority", .authority), (":scheme", .scheme),
            (":status", .status), (":protocol", .otherPseudo),
            ("content-type", .contentType), ("te", .te), ("user-agent", .userAgent), ("host", .host),
            ("grpc-timeout", .grpcTimeout), ("grpc-encoding", .grpcEncoding), ("grpc-accept-encoding", .grpcAcceptEncoding),
            ("grpc-status", .grpcStatus), ("grpc-message", .grpcMessage), ("grpc-status-details-bin", .grpcStatusDetailsBin),
            ("grpc-previous-rpc-attempts", .otherGRPC),
            ("content-length", .otherReserved), ("connection", .otherReserved), ("transfer-encoding", .otherReserved),
            ("keep-alive", .otherReserved), ("upgrade", .otherReserved), ("proxy-connection", .otherReserved),
            ("accept-encoding", .otherReserved),
            ("authorization", .metadata), ("x-request-id", .metadata), ("grpc", .metadata), ("grpcx-a", .metadata),
            ("content", .metadata), ("tee", .metadata), ("hosts", .metadata), ("trace-bin", .metadata), ("", .metadata),
        ]
        for (name, kind) in expected {
            #expect(HeaderName.classify(name) == kind, "\(name)")
            #expect(Metadata.isReserved(name) == (kind != .metadata), "\(name)")
        }
    }

    @Test func findsGzipAsAWholeToken() {
        func gzip(_ s: String) -> Bool { Array(s.utf8).withUnsafeBytes { HeaderName.listsGzip($0) } }
        #expect(gzip("gzip"))
        #expect(gzip("identity,gzip"))
        #expect(gzip("deflate, gzip ,identity"))
        #expect(!gzip("identity"))
        #expect(!gzip("xgzip,gzipx"))
        #expect(!gzip(""))
    }

    @Test func recognisesGRPCContentTypesAndBinaryNames() {
        func grpc(_ s: String) -> Bool { Array(s.utf8).withUnsafeBytes { HeaderName.isGRPCContentType($0) } }
        #expect(grpc("application/grpc") && grpc("application/grpc+proto") && grpc("application/grpc;charset=x"))
        #expect(!grpc("application/grpc-web") && !grpc("application/json") && !grpc("application/grp"))
        func binary(_ s: String) -> Bool { Array(s.utf8).withUnsafeBytes { HeaderName.isBinary($0) } }
        #expect(binary("trace-bin") && !binary("-bin") && !binary("x-binary"))
    }

    @Test func readsDecimalsStrictly() {
        func decimal(_ s: String) -> Int? { Array(s.utf8).withUnsafeBytes { HeaderName.decimal($0) } }
        #expect(decimal("200") == 200)
        #expect(decimal("0") == 0)
        #expect(decimal("16") == 16)
        #expect(decimal("") == nil)
        #expect(decimal("-1") == nil)
        #expect(decimal("2x") == nil)
        #expect(decimal("9999999999") == nil)
    }

    @Test func filteringKeepsOrderAndValues() {
        var m = Metadata()
        m.add("x-a", "1")
        m.add("x-drop", "2")
        m.add("x-b-bin", binary: [7])
        let kept = m.filter { $0 != "x-drop" }
        #expect(kept.entries.map(\.key) == ["x-a", "x-b-bin"])
        #expect(kept.binary("x-b-bin") == [7])
    }
}
