import Foundation
import RPCCore
import Testing

@testable import RPCTransport

/// The project's virtualenv (made by scripts/setup) has grpcio; fall back to python3.
let testPython: String = {
    let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    let venv = root.appendingPathComponent(".venv/bin/python").path
    return FileManager.default.isExecutableFile(atPath: venv) ? venv : "python3"
}()

/// Runs a Python grpcio client (a gRPC implementation we did not write) against our server.
func runPython(_ script: String) throws -> (status: Int32, output: String) {
    let python = ProcessInfo.processInfo.environment["TEST_PYTHON"] ?? testPython
    let p = Process()
    p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
    p.arguments = [python, "-c", script]
    let pipe = Pipe()
    p.standardOutput = pipe
    p.standardError = pipe
    try p.run()
    let data = pipe.fileHandleForReading.readDataToEndOfFile()
    p.waitUntilExit()
    return (p.terminationStatus, String(decoding: data, as: UTF8.self))
}

@Suite(.serialized) struct ServerSmokeTests {
    @Test func pythonClientAllCallKinds() async throws {
        let server = RPCServer(configuration: ServerConfiguration(host: "127.0.0.1", port: 0), services: [EchoService()])
        let port = try await server.start()
        defer { Task { await server.shutdownGracefully() } }
        let script = """
            import grpc, sys
            ch = grpc.insecure_channel('127.0.0.1:\(port)')
            u = ch.unary_unary('/test.Echo/Unary')
            r, call = u.with_call(b'hello', metadata=[('x-echo-initial','v1'),('x-echo-trailing-bin', b'\\x00\\x01\\xfe')])
            assert r == b'hello', r
            assert ('x-echo-initial','v1') in call.initial_metadata(), call.initial_metadata()
            assert ('x-echo-trailing-bin', b'\\x00\\x01\\xfe') in call.trailing_metadata(), call.trailing_metadata()
            s = ch.unary_stream('/test.Echo/Expand')
            msgs = list(s(b'5:1000'))
            assert len(msgs) == 5 and all(len(m) == 1000 for m in msgs)
            c = ch.stream_unary('/test.Echo/Collect')
            assert c(iter([b'a'*10, b'b'*20, b''])) == b'30'
            b = ch.stream_stream('/test.Echo/Chat')
            assert list(b(iter([b'x', b'yy', b'zzz']))) == [b'x', b'yy', b'zzz']
            try:
                ch.unary_unary('/test.Echo/Fail')(b'bad field\\tname \\u00e9 \\U0001F600 100%'.decode('unicode_escape').encode('utf-8') if False else 'bad field\\tname é 😀 100%\\r\\n'.encode())
                sys.exit('expected error')
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.code()
                assert e.details() == 'bad field\\tname é 😀 100%\\r\\n', repr(e.details())
                assert ('x-detail','kept') in e.trailing_metadata()
            try:
                ch.unary_unary('/test.Echo/Nope')(b'')
                sys.exit('expected error')
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNIMPLEMENTED, e.code()
            try:
                ch.unary_unary('/test.Other/Nope')(b'')
                sys.exit('expected error')
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNIMPLEMENTED, e.code()
            try:
                ch.unary_unary('/test.Echo/Sleep')(b'5', timeout=0.2)
                sys.exit('expected error')
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e.code()
            try:
                ch.unary_unary('/test.Echo/Unary')(b'\\xff')
                sys.exit('expected error')
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.code()
            cz = ch.unary_unary('/test.Echo/Unary')
            assert cz(b'z'*5000, compression=grpc.Compression.Gzip) == b'z'*5000
            big = ch.unary_unary('/test.Echo/Unary')
            try:
                big(b'q'*(5*1024*1024))
                sys.exit('expected error')
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.code()
            print('OK')
            """
        let (status, output) = try runPython(script)
        #expect(status == 0, "\(output)")
        #expect(output.contains("OK"), "\(output)")
    }
}
