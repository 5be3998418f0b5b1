//! The RPC server and client over real loopback sockets: calls, pipelining, batches,
//! oversized frames, peers that vanish mid-frame, bad preambles, shutdown.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use cairn_core::Error;
use cairn_net::rpc::PREAMBLE;
use cairn_net::{Client, ClientConfig, ServerConfig, ServerHandle, serve};

/// Echo server that prefixes each response with a per-server request counter byte.
fn echo(config: ServerConfig) -> (ServerHandle, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let h = serve("127.0.0.1:0", config, move |req: &[u8]| {
        c.fetch_add(1, Ordering::SeqCst);
        let mut out = b"re:".to_vec();
        out.extend_from_slice(req);
        out
    })
    .unwrap();
    (h, calls)
}

/// A raw connection that has done the handshake.
fn raw(h: &ServerHandle) -> TcpStream {
    let mut s = TcpStream::connect(h.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&PREAMBLE).unwrap();
    let mut pre = [0u8; 5];
    s.read_exact(&mut pre).unwrap();
    assert_eq!(pre, PREAMBLE);
    s
}

fn assert_closed(s: &mut TcpStream) {
    let mut b = [0u8; 16];
    match s.read(&mut b) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("connection should be closed, got {other:?}"),
    }
}

#[test]
fn call_and_pipeline_in_order() {
    let (h, calls) = echo(ServerConfig::default());
    let mut c = Client::connect(h.local_addr()).unwrap();
    assert_eq!(c.call(b"one").unwrap(), b"re:one");
    assert_eq!(c.call(b"").unwrap(), b"re:");
    for i in 0..500u32 {
        c.send(&i.to_le_bytes()).unwrap();
    }
    assert_eq!(c.in_flight(), 500);
    assert!(
        c.call(b"x").is_err(),
        "call refuses while responses are unread"
    );
    for i in 0..500u32 {
        let mut want = b"re:".to_vec();
        want.extend_from_slice(&i.to_le_bytes());
        assert_eq!(c.recv().unwrap(), want);
    }
    assert!(c.recv().is_err(), "nothing in flight");
    assert_eq!(calls.load(Ordering::SeqCst), 502);
    h.shutdown();
}

#[test]
fn batches_small_and_large() {
    let (h, _) = echo(ServerConfig::default());
    let mut c = Client::connect(h.local_addr()).unwrap();
    let small: Vec<Vec<u8>> = (0..100u8).map(|i| vec![i; 10]).collect();
    let out = c.call_batch(&small).unwrap();
    assert_eq!(out.len(), 100);
    for (i, o) in out.iter().enumerate() {
        assert_eq!(&o[3..], &small[i][..]);
    }
    // 64 MiB each way: far past what socket buffers hold, so it needs the writer thread.
    let large: Vec<Vec<u8>> = (0..64u8).map(|i| vec![i; 1 << 20]).collect();
    let out = c.call_batch(&large).unwrap();
    assert_eq!(out.len(), 64);
    for (i, o) in out.iter().enumerate() {
        assert_eq!(o.len(), 3 + (1 << 20));
        assert_eq!(o[3], i as u8);
    }
    assert_eq!(c.call(b"after").unwrap(), b"re:after");
}

/// A callback's panic is resumed even when the connection breaks later in the batch (it
/// was dropped, and the transport error returned instead).
#[test]
fn a_panic_in_call_batch_each_survives_a_broken_connection() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut pre = [0u8; 5];
        s.read_exact(&mut pre).unwrap();
        s.write_all(&PREAMBLE).unwrap();
        // Two requests in, one answer out, then the connection ends.
        let mut two = [0u8; 2 * (4 + 3)];
        s.read_exact(&mut two).unwrap();
        s.write_all(&2u32.to_be_bytes()).unwrap();
        s.write_all(b"ok").unwrap();
    });
    let mut c = Client::connect(addr).unwrap();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        c.call_batch_each(&[b"one", b"two"], |_, _| panic!("callback panics"))
    }));
    let p = caught.expect_err("the callback's panic was lost");
    assert_eq!(p.downcast_ref::<&str>(), Some(&"callback panics"));
}

/// A server that reads requests at about 20 MB/s (1 MiB every 50 ms) and answers each
/// whole one with "ok".
fn slow_reading_server() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        // Small buffers, as on a slow link (loopback's grow to tens of MiB, which the
        // upload would fill at once and the server then take seconds to read).
        socket2::SockRef::from(&s)
            .set_recv_buffer_size(256 << 10)
            .unwrap();
        let mut pre = [0u8; 5];
        s.read_exact(&mut pre).unwrap();
        s.write_all(&PREAMBLE).unwrap();
        let mut chunk = vec![0u8; 1 << 20];
        loop {
            let mut head = [0u8; 4];
            if s.read_exact(&mut head).is_err() {
                return;
            }
            let mut left = u32::from_be_bytes(head) as usize;
            while left > 0 {
                let n = left.min(chunk.len());
                if s.read_exact(&mut chunk[..n]).is_err() {
                    return;
                }
                left -= n;
                std::thread::sleep(Duration::from_millis(50));
            }
            s.write_all(&2u32.to_be_bytes()).unwrap();
            s.write_all(b"ok").unwrap();
        }
    });
    addr
}

/// A batch whose upload takes longer than the client's read timeout (a large request on
/// a slow link) is not cut for silence while the upload still makes progress: the server
/// cannot answer a request before it has read it.
#[test]
fn a_long_upload_in_a_batch_is_not_a_read_timeout() {
    let addr = slow_reading_server();
    let cfg = ClientConfig {
        read_timeout: Some(Duration::from_millis(1500)),
        ..ClientConfig::default()
    };
    let mut c = Client::connect_with(addr, cfg).unwrap();
    // About 3 s to upload at the server's pace; the last few MiB (what the socket buffers
    // hold when the upload ends) take well under the timeout.
    let batch = vec![b"small".to_vec(), vec![1u8; (64 << 20) - 64]];
    let t = std::time::Instant::now();
    let out = c.call_batch(&batch).unwrap();
    assert!(
        t.elapsed() > Duration::from_millis(1000),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(out, vec![b"ok".to_vec(), b"ok".to_vec()]);
}

/// `call_batch_each` hands over every response in order; an error from the callback is
/// returned after the rest of the batch is drained, and the connection stays usable.
#[test]
fn call_batch_each_streams_and_survives_a_failing_callback() {
    let (h, _) = echo(ServerConfig::default());
    let mut c = Client::connect(h.local_addr()).unwrap();
    for size in [10usize, 64 << 10] {
        let reqs: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; size]).collect();
        let mut seen = Vec::new();
        c.call_batch_each(&reqs, |i, r| {
            assert_eq!(&r[3..], &reqs[i][..]);
            seen.push(i);
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, (0..40).collect::<Vec<_>>());
        let mut calls = 0;
        let err = c
            .call_batch_each(&reqs, |i, _| {
                calls += 1;
                if i == 5 {
                    Err(Error::invalid("stop at 5"))
                } else {
                    Ok(())
                }
            })
            .unwrap_err();
        assert!(err.to_string().contains("stop at 5"), "{err}");
        assert_eq!(calls, 6, "no response is handed over after the failure");
        assert_eq!(c.call(b"after").unwrap(), b"re:after");
        // A panicking callback: the batch is drained, the panic resumed, and the
        // connection still answers in step.
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            c.call_batch_each(&reqs, |i, _| {
                assert!(i != 3, "handler panics at 3");
                Ok(())
            })
        }));
        assert!(caught.is_err());
        assert_eq!(c.call(b"again").unwrap(), b"re:again");
    }
}

#[test]
fn many_clients_at_once() {
    let (h, calls) = echo(ServerConfig::default());
    let addr = h.local_addr();
    std::thread::scope(|s| {
        for t in 0..8u8 {
            s.spawn(move || {
                let mut c = Client::connect(addr).unwrap();
                for i in 0..200u8 {
                    assert_eq!(c.call(&[t, i]).unwrap(), [b'r', b'e', b':', t, i]);
                }
            });
        }
    });
    assert_eq!(calls.load(Ordering::SeqCst), 1600);
}

#[test]
fn oversized_frames() {
    let cfg = ServerConfig {
        max_frame: 1000,
        ..ServerConfig::default()
    };
    let (h, calls) = echo(cfg);
    // The client refuses to send what its own limit forbids, and stays usable.
    let mut c = Client::connect_with(
        h.local_addr(),
        ClientConfig {
            max_frame: 1000,
            ..ClientConfig::default()
        },
    )
    .unwrap();
    let err = c.call(&[0; 1001]).unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err}");
    assert!(err.to_string().contains("too large"), "{err}");
    assert_eq!(c.call(&[1; 997]).unwrap().len(), 1000);
    // A response over the client's limit is a clear error; the client is then unusable.
    let err = c.call(&[1; 998]).unwrap_err();
    assert!(matches!(err, Error::Decode(_)), "{err}");
    assert!(err.to_string().contains("frame too large"), "{err}");
    assert!(matches!(c.call(b"x"), Err(Error::Unavailable(_))));
    // A peer announcing a frame over the server's limit is disconnected, unanswered.
    let mut s = raw(&h);
    s.write_all(&1001u32.to_be_bytes()).unwrap();
    assert_closed(&mut s);
    // Other connections are unaffected.
    let before = calls.load(Ordering::SeqCst);
    assert_eq!(
        Client::connect(h.local_addr())
            .unwrap()
            .call(b"ok")
            .unwrap(),
        b"re:ok"
    );
    assert_eq!(calls.load(Ordering::SeqCst), before + 1);
}

#[test]
fn peer_disconnects_mid_frame() {
    let (h, calls) = echo(ServerConfig::default());
    // Mid-header.
    let mut s = raw(&h);
    s.write_all(&[0, 0]).unwrap();
    drop(s);
    // Mid-payload: announces 100 bytes, sends 10.
    let mut s = raw(&h);
    s.write_all(&100u32.to_be_bytes()).unwrap();
    s.write_all(&[7; 10]).unwrap();
    drop(s);
    // A whole request then a torn one: the whole one is answered.
    let mut s = raw(&h);
    s.write_all(&2u32.to_be_bytes()).unwrap();
    s.write_all(b"hi").unwrap();
    s.write_all(&50u32.to_be_bytes()).unwrap();
    s.write_all(&[1; 5]).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    assert_eq!(got, [&5u32.to_be_bytes()[..], b"re:hi"].concat());
    assert_eq!(
        Client::connect(h.local_addr())
            .unwrap()
            .call(b"ok")
            .unwrap(),
        b"re:ok"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[test]
fn server_disconnects_mid_response() {
    // A fake server that handshakes, then sends half a response frame and hangs up.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut pre = [0u8; 5];
        s.read_exact(&mut pre).unwrap();
        s.write_all(&PREAMBLE).unwrap();
        let mut hdr = [0u8; 4];
        s.read_exact(&mut hdr).unwrap();
        let mut req = vec![0u8; u32::from_be_bytes(hdr) as usize];
        s.read_exact(&mut req).unwrap();
        s.write_all(&10u32.to_be_bytes()).unwrap();
        s.write_all(b"half").unwrap();
    });
    let mut c = Client::connect(addr).unwrap();
    let err = c.call(b"q").unwrap_err();
    assert!(
        matches!(&err, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::UnexpectedEof),
        "{err}"
    );
    assert!(matches!(c.call(b"again"), Err(Error::Unavailable(_))));
    t.join().unwrap();
}

#[test]
fn bad_preamble_is_refused() {
    let (h, calls) = echo(ServerConfig::default());
    let mut s = TcpStream::connect(h.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    assert_closed(&mut s);
    // And a client refuses a server that is not one.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.write_all(b"SSH-2").unwrap();
        let mut b = [0u8; 5];
        let _ = s.read_exact(&mut b);
    });
    let err = Client::connect(addr).unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err}");
    t.join().unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[test]
fn shutdown_stops_accepting_and_ends_connections() {
    let (h, _) = echo(ServerConfig::default());
    let addr = h.local_addr();
    let mut c = Client::connect(addr).unwrap();
    assert_eq!(c.call(b"a").unwrap(), b"re:a");
    // An idle connection that never finished its handshake does not block shutdown.
    let _idle = TcpStream::connect(addr).unwrap();
    h.shutdown();
    assert!(c.call(b"b").is_err(), "connection ended by shutdown");
    assert!(
        Client::connect_with(
            addr,
            ClientConfig {
                connect_timeout: Some(Duration::from_secs(2)),
                read_timeout: Some(Duration::from_secs(2)),
                ..ClientConfig::default()
            }
        )
        .is_err(),
        "no longer accepting"
    );
}

#[test]
fn shutdown_answers_received_requests() {
    let (tx, rx) = std::sync::mpsc::sync_channel::<()>(0);
    let rx = std::sync::Mutex::new(rx);
    let h = serve(
        "127.0.0.1:0",
        ServerConfig::default(),
        move |req: &[u8]| {
            if req == b"slow" {
                let _ = rx.lock().unwrap().recv();
            }
            req.to_vec()
        },
    )
    .unwrap();
    let mut c = Client::connect(h.local_addr()).unwrap();
    c.send(b"slow").unwrap();
    c.send(b"next").unwrap();
    c.flush().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let stopper = std::thread::spawn(move || h.shutdown());
    std::thread::sleep(Duration::from_millis(100));
    tx.send(()).unwrap();
    assert_eq!(c.recv().unwrap(), b"slow");
    stopper.join().unwrap();
    // "next" was already received by the server when it stopped reading, or it was not:
    // either it is answered or the connection ends cleanly; it is never answered wrongly.
    match c.recv() {
        Ok(r) => assert_eq!(r, b"next"),
        Err(e) => assert!(matches!(e, Error::Io { .. }), "{e}"),
    }
}

/// A client that keeps its pipeline full does not hold a shutdown: the server answers
/// the requests it holds whole and stops (it kept reading new ones for as long as they
/// came, and `shutdown` waited for it).
#[test]
fn shutdown_ends_a_connection_that_keeps_sending() {
    let (h, _) = echo(ServerConfig::default());
    let s = raw(&h);
    let mut w = s.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let frame = [&4u32.to_be_bytes()[..], b"ping"].concat();
        let burst: Vec<u8> = frame.repeat(256);
        while w.write_all(&burst).is_ok() {}
    });
    let mut r = s.try_clone().unwrap();
    let drainer = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        while matches!(r.read(&mut buf), Ok(n) if n > 0) {}
    });
    std::thread::sleep(Duration::from_millis(300));
    let t = std::time::Instant::now();
    let stopper = std::thread::spawn(move || h.shutdown());
    while !stopper.is_finished() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "shutdown still waits for a connection that keeps sending"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    stopper.join().unwrap();
    let _ = s.shutdown(std::net::Shutdown::Both);
    sender.join().unwrap();
    drainer.join().unwrap();
}

/// A stopping server delivers the answer of every request it ran to a client that sent
/// a long pipeline of large requests and reads the answers slowly: the server stops
/// reading with requests still unread in its socket, and closed so, the socket was reset
/// and the answers still queued for the client dropped (a stored write whose ack never
/// came).
#[test]
fn a_stopping_server_delivers_every_answer_it_made() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let h = serve(
        "127.0.0.1:0",
        ServerConfig::default(),
        move |_req: &[u8]| {
            c.fetch_add(1, Ordering::SeqCst);
            vec![7u8; 64 << 10]
        },
    )
    .unwrap();
    let s = raw(&h);
    // A small receive buffer: the server's answers back up behind the slow reader, so it
    // stops reading requests, which wait unread in its socket.
    socket2::SockRef::from(&s)
        .set_recv_buffer_size(64 << 10)
        .unwrap();
    let mut w = s.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let frame = [&(16u32 << 10).to_be_bytes()[..], &[1u8; 16 << 10]].concat();
        for _ in 0..400 {
            if w.write_all(&frame).is_err() {
                return;
            }
        }
    });
    let mut r = s.try_clone().unwrap();
    let reader = std::thread::spawn(move || {
        let mut got = 0usize;
        let mut frame = vec![0u8; 4 + (64 << 10)];
        loop {
            match r.read_exact(&mut frame) {
                Ok(()) => got += 1,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(got),
                Err(e) => return Err((got, e)),
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    h.shutdown();
    let got = reader.join().unwrap();
    let _ = s.shutdown(std::net::Shutdown::Both);
    sender.join().unwrap();
    let ran = calls.load(Ordering::SeqCst);
    assert!(ran < 400, "every request was run before the stop ({ran})");
    match got {
        Ok(n) => assert_eq!(n, ran, "answers delivered vs requests run"),
        Err((n, e)) => panic!("{n} of {ran} answers, then {e}"),
    }
}

/// The answer to a request goes out while the next request is still arriving: with part
/// of it buffered the server waited for all of it before flushing, so a client timing
/// out on silence gave up during a long pipelined upload.
#[test]
fn answers_go_out_while_the_next_request_arrives() {
    let (h, _) = echo(ServerConfig::default());
    let mut s = raw(&h);
    let mut first = 1u32.to_be_bytes().to_vec();
    first.push(b'a');
    // The second request's header and a little of its payload, in the same write.
    first.extend_from_slice(&(1u32 << 20).to_be_bytes());
    first.extend_from_slice(&[0u8; 100]);
    s.write_all(&first).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut head = [0u8; 4];
    s.read_exact(&mut head)
        .expect("the first answer did not come while the second request was unfinished");
    let mut body = vec![0u8; u32::from_be_bytes(head) as usize];
    s.read_exact(&mut body).unwrap();
    assert_eq!(body, b"re:a");
    drop(s);
    h.shutdown();
}

/// A client that takes a large response a little at a time (1 MiB a second, each write
/// of the server making progress within the write timeout, but below the minimum rate) is dropped once it falls behind that rate, not at the end of the
/// time the whole response's length allows: it held the response's memory all that time.
/// Seen from the server: its connection thread ends, so a shutdown does not wait for it.
#[test]
fn a_client_taking_a_response_too_slowly_is_dropped_when_it_falls_behind() {
    let cfg = ServerConfig {
        write_timeout: Some(Duration::from_secs(3)),
        // The length alone allows 96 MiB 25 s at this rate. (What the socket buffers
        // take at once, several MiB on loopback, counts as taken.)
        min_request_rate: 4 << 20,
        ..ServerConfig::default()
    };
    let h = serve("127.0.0.1:0", cfg, |_req: &[u8]| vec![9u8; 96 << 20]).unwrap();
    let mut s = raw(&h);
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(&3u32.to_be_bytes()).unwrap();
    s.write_all(b"big").unwrap();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = done.clone();
    let reader = std::thread::spawn(move || {
        // 1 MiB a second: enough for every write of the server to make progress within
        // its timeout, a quarter of the minimum rate.
        let mut buf = vec![0u8; 256 << 10];
        while !stop.load(Ordering::SeqCst) {
            if s.read_exact(&mut buf).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    });
    std::thread::sleep(Duration::from_secs(12));
    let t = std::time::Instant::now();
    h.shutdown();
    let waited = t.elapsed();
    done.store(true, Ordering::SeqCst);
    reader.join().unwrap();
    assert!(
        waited < Duration::from_secs(4),
        "the slow reader was still served 12 s in (shutdown waited {waited:?})"
    );
}

/// Whether a new client gets an answer from the echo server at `addr` within about three
/// seconds of retrying (a slot may take a moment to free).
fn served_soon(addr: std::net::SocketAddr) -> bool {
    for _ in 0..60 {
        let r = Client::connect_with(
            addr,
            ClientConfig {
                read_timeout: Some(std::time::Duration::from_secs(2)),
                ..ClientConfig::default()
            },
        )
        .and_then(|mut c| c.call(b"hello"));
        if let Ok(v) = r {
            assert_eq!(v, b"re:hello");
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    false
}

/// Peers that finished the preamble and then send nothing are dropped after the idle
/// timeout, so a few of them cannot hold every connection slot: a client coming later is
/// served.
#[test]
fn idle_peers_give_their_slots_back() {
    let cfg = ServerConfig {
        max_connections: 2,
        idle_timeout: Some(std::time::Duration::from_millis(300)),
        ..ServerConfig::default()
    };
    let (h, _) = echo(cfg);
    let mut idle = Vec::new();
    for _ in 0..2 {
        let mut s = std::net::TcpStream::connect(h.local_addr()).unwrap();
        std::io::Write::write_all(&mut s, &cairn_net::rpc::PREAMBLE).unwrap();
        idle.push(s);
    }
    std::thread::sleep(std::time::Duration::from_millis(900));
    assert!(
        served_soon(h.local_addr()),
        "the idle peers kept every slot"
    );
    drop(idle);
}

/// A peer that trickles a request (a byte well inside every idle timeout) is cut once the
/// request's time runs out, so it cannot hold its slot: a client coming later is served,
/// and the trickler's connection is closed.
#[test]
fn a_trickled_request_gives_its_slot_back() {
    use std::io::{Read, Write};
    let cfg = ServerConfig {
        max_connections: 1,
        idle_timeout: Some(std::time::Duration::from_secs(10)),
        request_timeout: Some(std::time::Duration::from_millis(300)),
        ..ServerConfig::default()
    };
    let (h, _) = echo(cfg);
    let mut slow = std::net::TcpStream::connect(h.local_addr()).unwrap();
    slow.write_all(&cairn_net::rpc::PREAMBLE).unwrap();
    let mut pre = [0u8; 5];
    slow.read_exact(&mut pre).unwrap();
    // A 100-byte request, one byte every 50 ms (5 s in all, far past 300 ms).
    slow.write_all(&100u32.to_be_bytes()).unwrap();
    let trickler = std::thread::spawn(move || {
        for _ in 0..100 {
            if slow.write_all(b"x").is_err() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        // Closed by the server: the next read sees the end.
        slow.set_read_timeout(Some(std::time::Duration::from_secs(1)))
            .unwrap();
        matches!(slow.read(&mut [0u8; 1]), Ok(0) | Err(_))
    });
    std::thread::sleep(std::time::Duration::from_millis(600));
    assert!(
        served_soon(h.local_addr()),
        "the trickling peer kept the only slot"
    );
    assert!(
        trickler.join().unwrap(),
        "the trickler's connection stayed open"
    );
}

/// A handler that panics ends its connection at once: the client gets an error instead of
/// waiting on a socket nobody serves.
#[test]
fn a_panicking_handler_closes_its_connection() {
    let h = serve("127.0.0.1:0", ServerConfig::default(), |r: &[u8]| {
        if r == b"boom" {
            panic!("handler bug (expected by this test)")
        }
        r.to_vec()
    })
    .unwrap();
    let mut c = Client::connect_with(
        h.local_addr(),
        ClientConfig {
            read_timeout: Some(std::time::Duration::from_secs(20)),
            ..ClientConfig::default()
        },
    )
    .unwrap();
    let t = std::time::Instant::now();
    assert!(c.call(b"boom").is_err());
    assert!(
        t.elapsed() < std::time::Duration::from_secs(10),
        "the client waited {:?} on a dead connection",
        t.elapsed()
    );
    let mut c2 = Client::connect(h.local_addr()).unwrap();
    assert_eq!(c2.call(b"ok").unwrap(), b"ok");
}

/// Requests in progress share the server's memory budget: while one peer holds all of it
/// (a large request it stopped sending halfway), another request waits instead of growing
/// the server's memory, and is served once the memory is given back.
#[test]
fn requests_wait_for_the_memory_budget() {
    let cfg = ServerConfig {
        max_frame: 1 << 20,
        max_request_memory: 1 << 20,
        ..ServerConfig::default()
    };
    let (h, calls) = echo(cfg);
    let mut hog = raw(&h);
    hog.write_all(&(1u32 << 20).to_be_bytes()).unwrap();
    hog.write_all(&vec![7u8; 900 << 10]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let addr = h.local_addr();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let mut c = Client::connect(addr).unwrap();
        let r = c.call(&vec![1u8; 512 << 10]);
        let _ = tx.send(());
        r
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(800)).is_err(),
        "a request was read past the memory budget"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    drop(hog);
    let answer = waiter.join().unwrap().unwrap();
    assert_eq!(answer.len(), 3 + (512 << 10));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // Small requests flow as before.
    assert!(served_soon(addr));
}

/// A client that takes its response too slowly (here at about 1 MiB/s, each write
/// progressing within the write timeout) is dropped when the response's time runs out, so
/// it holds neither its thread nor the server's shutdown for long.
#[test]
fn a_slow_reader_is_dropped_when_its_response_runs_out_of_time() {
    let cfg = ServerConfig {
        write_timeout: Some(Duration::from_millis(300)),
        min_request_rate: 1 << 30,
        ..ServerConfig::default()
    };
    let h = serve("127.0.0.1:0", cfg, |_req: &[u8]| vec![9u8; 64 << 20]).unwrap();
    let mut s = raw(&h);
    s.write_all(&3u32.to_be_bytes()).unwrap();
    s.write_all(b"big").unwrap();
    let t = std::time::Instant::now();
    let reader = std::thread::spawn(move || {
        let mut got = 0usize;
        let mut buf = vec![0u8; 256 << 10];
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return got,
                Ok(n) => got += n,
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    let got = reader.join().unwrap();
    assert!(got < (64 << 20), "the whole slow response was sent");
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "the slow reader was served for {:?}",
        t.elapsed()
    );
    let t = std::time::Instant::now();
    h.shutdown();
    assert!(t.elapsed() < Duration::from_secs(5));
}

/// One address holds at most `max_connections_per_ip` connections: the next one from it is
/// closed at once, and a slot it gives back can be taken again.
#[test]
fn one_address_holds_at_most_its_share_of_connections() {
    let cfg = ServerConfig {
        max_connections_per_ip: 2,
        limit_loopback: true,
        ..ServerConfig::default()
    };
    let (h, _) = echo(cfg);
    let first = raw(&h);
    let _second = raw(&h);
    let mut third = TcpStream::connect(h.local_addr()).unwrap();
    third
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _ = third.write_all(&PREAMBLE);
    let mut pre = [0u8; 5];
    assert!(
        third.read_exact(&mut pre).is_err(),
        "a third connection from one address was served"
    );
    drop(first);
    std::thread::sleep(Duration::from_millis(200));
    assert!(served_soon(h.local_addr()));
}

/// Connections idle after a large request hold none of the memory budget: their buffers
/// are given back, so a client coming later is served at once.
#[test]
fn idle_connections_hold_no_request_memory() {
    let cfg = ServerConfig {
        max_frame: 1 << 20,
        max_request_memory: 2 << 20,
        request_timeout: Some(Duration::from_secs(2)),
        ..ServerConfig::default()
    };
    let (h, _) = echo(cfg);
    let idle: Vec<Client> = (0..4)
        .map(|_| {
            let mut c = Client::connect(h.local_addr()).unwrap();
            assert_eq!(
                c.call(&vec![1u8; (1 << 20) - 64]).unwrap().len(),
                3 + (1 << 20) - 64
            );
            c
        })
        .collect();
    let mut late = Client::connect(h.local_addr()).unwrap();
    let t = std::time::Instant::now();
    assert_eq!(
        late.call(&vec![2u8; 512 << 10]).unwrap().len(),
        3 + (512 << 10)
    );
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "waited {:?}",
        t.elapsed()
    );
    drop(idle);
}

/// A response counts against the memory budget until it is written: a peer that sends a
/// small request and never reads holds its large response's share, and another client's
/// large response waits for memory instead of adding to it; once the hog goes, it flows.
/// Before, responses were outside every limit, so peers that never read could pin one
/// large response per connection.
#[test]
fn responses_wait_for_the_memory_budget() {
    let cfg = ServerConfig {
        max_frame: 1 << 20,
        max_request_memory: 32 << 20,
        ..ServerConfig::default()
    };
    let h = serve("127.0.0.1:0", cfg, |_req: &[u8]| vec![5u8; 24 << 20]).unwrap();
    let mut hog = raw(&h);
    hog.write_all(&3u32.to_be_bytes()).unwrap();
    hog.write_all(b"big").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let addr = h.local_addr();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let mut c = Client::connect(addr).unwrap();
        let r = c.call(b"big too");
        let _ = tx.send(());
        r
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(800)).is_err(),
        "a response was held past the memory budget"
    );
    drop(hog);
    let answer = waiter.join().unwrap().unwrap();
    assert_eq!(answer.len(), 24 << 20);
}

/// A peer that never reads its response is dropped after the write timeout of silence,
/// whatever time the response's length would allow, so the memory budget its response
/// held serves others again: a 32 MiB answer held it for 60 s plus a second per 64 KiB.
#[test]
fn a_peer_that_never_reads_frees_the_budget_after_the_write_timeout() {
    let cfg = ServerConfig {
        max_frame: 1 << 20,
        max_request_memory: 40 << 20,
        write_timeout: Some(Duration::from_secs(1)),
        // The length alone would allow over eight minutes.
        min_request_rate: 64 << 10,
        ..ServerConfig::default()
    };
    let h = serve("127.0.0.1:0", cfg, |_req: &[u8]| vec![5u8; 32 << 20]).unwrap();
    let mut hog = raw(&h);
    hog.write_all(&3u32.to_be_bytes()).unwrap();
    hog.write_all(b"big").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let t = std::time::Instant::now();
    let mut c = Client::connect(h.local_addr()).unwrap();
    let answer = c.call(b"big too").unwrap();
    assert_eq!(answer.len(), 32 << 20);
    assert!(
        t.elapsed() < Duration::from_secs(8),
        "served after {:?}",
        t.elapsed()
    );
    drop(hog);
}

/// Within a request, a peer that stops sending is cut after the request timeout of
/// silence, whatever time the announced length would allow: one that sent most of a large
/// frame and then stalled held its memory until the whole length's time ran out.
#[test]
fn a_request_that_stalls_midway_is_cut_after_the_request_timeout() {
    let cfg = ServerConfig {
        max_frame: 1 << 20,
        request_timeout: Some(Duration::from_secs(1)),
        // The announced length alone would allow over a quarter of an hour.
        min_request_rate: 1 << 10,
        ..ServerConfig::default()
    };
    let (h, calls) = echo(cfg);
    let mut s = raw(&h);
    s.write_all(&(1u32 << 20).to_be_bytes()).unwrap();
    s.write_all(&vec![7u8; 900 << 10]).unwrap();
    let t = std::time::Instant::now();
    assert_closed(&mut s);
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "cut after {:?}",
        t.elapsed()
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert!(served_soon(h.local_addr()));
}

/// A fake server that sends the preamble and then neither reads nor answers; the
/// listener thread keeps the accepted socket open until `hold` ends.
fn silent_server(hold: Duration) -> (std::net::SocketAddr, std::thread::JoinHandle<()>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.write_all(&PREAMBLE).unwrap();
        std::thread::sleep(hold);
    });
    (addr, t)
}

/// A server that stops answering, or stops reading, breaks the client's call with an
/// I/O error within the client's timeouts, not never; the defaults have both timeouts.
#[test]
fn a_silent_server_times_the_client_out() {
    let d = ClientConfig::default();
    assert!(d.read_timeout.is_some() && d.write_timeout.is_some());
    let cfg = ClientConfig {
        read_timeout: Some(Duration::from_millis(200)),
        write_timeout: Some(Duration::from_millis(200)),
        ..ClientConfig::default()
    };
    // No answer to a small request.
    let (addr, t) = silent_server(Duration::from_millis(2500));
    let mut c = Client::connect_with(addr, cfg.clone()).unwrap();
    let start = std::time::Instant::now();
    let err = c.call(b"hello").unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    assert!(
        start.elapsed() < Duration::from_millis(1500),
        "{:?}",
        start.elapsed()
    );
    assert!(matches!(c.call(b"x"), Err(Error::Unavailable(_))));
    t.join().unwrap();
    // Requests the server never reads: the socket buffers fill and the write gives up.
    let (addr, t) = silent_server(Duration::from_millis(2500));
    let mut c = Client::connect_with(addr, cfg).unwrap();
    let start = std::time::Instant::now();
    let big = vec![7u8; 1 << 20];
    let err = (0..64)
        .find_map(|_| c.send(&big).and_then(|()| c.flush()).err())
        .expect("64 MiB never read by the server cannot all be sent");
    assert!(matches!(err, Error::Io { .. }), "{err}");
    assert!(
        start.elapsed() < Duration::from_millis(1500),
        "{:?}",
        start.elapsed()
    );
    t.join().unwrap();
}

/// A handler's reservation for an answer it is about to build comes out of the same
/// budget: a second handler's reservation waits until the first answer is written, and
/// nothing waits once it is (the reservation was kept for the answer, then given back).
#[test]
fn reservations_for_answers_wait_for_the_memory_budget() {
    use std::sync::Mutex;
    use std::sync::atomic::AtomicBool;
    let cfg = ServerConfig {
        max_frame: 1 << 20,
        max_request_memory: 1 << 20,
        ..ServerConfig::default()
    };
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let go_rx = Mutex::new(go_rx);
    let first_holds = Arc::new(AtomicBool::new(false));
    let second_has = Arc::new(AtomicBool::new(false));
    let (f, s) = (first_holds.clone(), second_has.clone());
    let h = cairn_net::serve_reserving(
        "127.0.0.1:0",
        cfg,
        move |req: &[u8], mem: &mut cairn_net::Reserve<'_, '_>| {
            if mem.reserve(900 << 10).is_err() {
                return b"busy".to_vec();
            }
            assert_eq!(mem.reserved(), 900 << 10);
            if req == b"first" {
                f.store(true, Ordering::SeqCst);
                let _ = go_rx.lock().unwrap().recv();
            } else {
                s.store(true, Ordering::SeqCst);
            }
            req.to_vec()
        },
    )
    .unwrap();
    let addr = h.local_addr();
    let first = std::thread::spawn(move || Client::connect(addr).unwrap().call(b"first"));
    while !first_holds.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let second = std::thread::spawn(move || Client::connect(addr).unwrap().call(b"second"));
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !second_has.load(Ordering::SeqCst),
        "a reservation was granted past the memory budget"
    );
    go_tx.send(()).unwrap();
    assert_eq!(first.join().unwrap().unwrap(), b"first");
    assert_eq!(second.join().unwrap().unwrap(), b"second");
    // The budget is whole again: a third reservation is granted at once.
    let t = std::time::Instant::now();
    let mut c = Client::connect(addr).unwrap();
    assert_eq!(c.call(b"third").unwrap(), b"third");
    assert!(t.elapsed() < Duration::from_secs(5));
}

/// A reservation larger than the whole budget takes the whole budget (once free) instead
/// of waiting for memory the server can never have: an answer larger than the budget is
/// still served when nothing else holds memory.
#[test]
fn a_reservation_over_the_whole_budget_takes_the_budget() {
    let cfg = ServerConfig {
        max_frame: 1 << 20,
        max_request_memory: 1 << 20,
        ..ServerConfig::default()
    };
    let h = cairn_net::serve_reserving(
        "127.0.0.1:0",
        cfg,
        |_req: &[u8], mem: &mut cairn_net::Reserve<'_, '_>| match mem.reserve(3 << 20) {
            Ok(()) => vec![1u8; 2 << 20],
            Err(e) => e.to_string().into_bytes(),
        },
    )
    .unwrap();
    let t = std::time::Instant::now();
    let mut c = Client::connect_with(
        h.local_addr(),
        ClientConfig {
            max_frame: 4 << 20,
            ..ClientConfig::default()
        },
    )
    .unwrap();
    assert_eq!(c.call(b"big").unwrap(), vec![1u8; 2 << 20]);
    assert_eq!(c.call(b"again").unwrap(), vec![1u8; 2 << 20]);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}
