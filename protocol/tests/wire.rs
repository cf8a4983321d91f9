//! Round trips, limits and hostile input for the wire format.

use kedge_protocol::*;
use proptest::prelude::*;

fn workload_ref() -> impl Strategy<Value = WorkloadRef> {
    (
        "[a-z/0-9]{1,12}",
        "[A-Za-z]{1,12}",
        "[a-z0-9-]{1,20}",
        "[a-z0-9-]{1,20}",
    )
        .prop_map(|(api_version, kind, namespace, name)| WorkloadRef {
            api_version,
            kind,
            namespace,
            name,
        })
}

fn failure() -> impl Strategy<Value = Option<Failure>> {
    proptest::option::of((any::<bool>(), 0u8..9, ".{0,40}").prop_map(
        |(transient, code, message)| Failure {
            retry: if transient {
                Retry::Transient
            } else {
                Retry::Permanent
            },
            code: [
                FailureCode::NamespaceNotAllowed,
                FailureCode::NotFound,
                FailureCode::Forbidden,
                FailureCode::Invalid,
                FailureCode::ApiUnavailable,
                FailureCode::Conflict,
                FailureCode::NotOwned,
                FailureCode::Other,
                FailureCode::KindNotAllowed,
            ][code as usize],
            message,
        },
    ))
}

fn scrape_target() -> impl Strategy<Value = ScrapeTarget> {
    (
        "[a-z0-9-]{1,10}/[a-z0-9-]{1,10}",
        any::<u32>(),
        workload_ref(),
        ".{0,30}",
        prop_oneof![
            any::<u16>().prop_map(ScrapePort::Number),
            "[a-z0-9-]{0,15}".prop_map(ScrapePort::Name),
        ],
        ".{0,40}",
        any::<bool>(),
        (any::<u64>(), any::<u64>()),
    )
        .prop_map(
            |(
                owner,
                trigger,
                workload,
                metric_name,
                port,
                path,
                https,
                (interval_ms, timeout_ms),
            )| {
                ScrapeTarget {
                    owner,
                    trigger,
                    workload,
                    metric_name,
                    port,
                    path,
                    https,
                    interval_ms,
                    timeout_ms,
                }
            },
        )
}

fn pod_metrics_sample() -> impl Strategy<Value = PodMetricsSample> {
    (
        "[a-z0-9-]{1,10}/[a-z0-9-]{1,10}",
        any::<u32>(),
        // Any bit pattern but NaN, which never equals itself.
        any::<f64>().prop_filter("NaN", |v| !v.is_nan()),
        any::<u32>(),
        any::<u32>(),
        any::<i64>(),
        proptest::option::of(".{0,60}"),
    )
        .prop_map(
            |(owner, trigger, sum, counted, missing, scraped_unix_ms, error)| PodMetricsSample {
                owner,
                trigger,
                sum,
                counted,
                missing,
                scraped_unix_ms,
                error,
            },
        )
}

fn agent_message() -> impl Strategy<Value = AgentMessage> {
    prop_oneof![
        (
            any::<u16>(),
            ".{0,20}",
            ".{0,20}",
            any::<u64>(),
            prop::collection::vec("[a-z]{1,8}", 0..4)
        )
            .prop_map(
                |(
                    protocol_version,
                    agent_version,
                    kubernetes_version,
                    last_applied_revision,
                    namespaces,
                )| {
                    AgentMessage::Hello(Hello {
                        protocol_version,
                        agent_version,
                        kubernetes_version,
                        last_applied_revision,
                        namespaces,
                    })
                }
            ),
        (any::<u64>(), any::<i64>()).prop_map(|(seq, sent_unix_ms)| AgentMessage::Heartbeat(
            Heartbeat { seq, sent_unix_ms }
        )),
        (
            any::<u64>(),
            prop::collection::vec((workload_ref(), failure()), 0..5)
        )
            .prop_map(|(revision, results)| {
                AgentMessage::Ack(Ack {
                    revision,
                    results: results
                        .into_iter()
                        .map(|(w, failure)| CommandResult {
                            target: CommandTarget::Workload(w),
                            failure,
                        })
                        .collect(),
                })
            }),
        (
            any::<bool>(),
            prop::collection::vec(
                (
                    workload_ref(),
                    any::<bool>(),
                    any::<i32>(),
                    any::<u64>(),
                    any::<Option<String>>()
                ),
                0..5
            ),
            any::<Option<u64>>()
        )
            .prop_map(|(full, workloads, cpu)| AgentMessage::Report(StatusReport {
                full,
                workloads: workloads
                    .into_iter()
                    .map(|(workload, exists, n, ms, conflict)| WorkloadStatus {
                        workload,
                        exists,
                        spec_replicas: n,
                        ready_replicas: n,
                        available_replicas: n,
                        pending_pods: 0,
                        unschedulable_pods: 0,
                        unschedulable_for_ms: ms,
                        pod_cpu_millis: ms,
                        pod_memory_bytes: 0,
                        failure: None,
                        conflict,
                    })
                    .collect(),
                more: false,
                jobs: vec![JobStatus {
                    namespace: "ns".into(),
                    name: "job".into(),
                    owner: "ns/dsj".into(),
                    phase: JobPhase::Running,
                    created_unix_ms: 1_767_225_600_000,
                    any_pod_running_or_completed: true,
                    true_pod_conditions: vec![PodConditionSet {
                        true_conditions: vec!["PodScheduled".into(), "Ready".into()],
                        pods: 1
                    }],
                    pending_reason: None,
                    failure_reason: None,
                    finished_unix_ms: None,
                    replaces: Some("stuck".into()),
                    template: Some("0123456789abcdef".into())
                }],
                removed_jobs: vec![JobRef {
                    namespace: "ns".into(),
                    name: "gone".into()
                }],
                capacity: cpu.map(|c| ClusterCapacity {
                    allocatable_cpu_millis: c,
                    ..Default::default()
                }),
            })),
        prop::collection::vec(pod_metrics_sample(), 0..5)
            .prop_map(|samples| AgentMessage::PodMetrics(PodMetricsReport { samples })),
    ]
}

fn hub_message() -> impl Strategy<Value = HubMessage> {
    prop_oneof![
        (any::<u16>(), ".{0,20}", any::<u64>()).prop_map(
            |(protocol_version, session_id, heartbeat_interval_ms)| {
                HubMessage::Welcome(Welcome {
                    protocol_version,
                    hub_version: "0.1.0".into(),
                    session_id,
                    member: "m".into(),
                    heartbeat_interval_ms,
                })
            }
        ),
        ".{0,60}".prop_map(|message| HubMessage::Refused(Refusal {
            code: RefusalCode::UnsupportedVersion,
            message,
            min_protocol_version: 1,
            max_protocol_version: 1
        })),
        any::<u64>().prop_map(|seq| HubMessage::HeartbeatAck(HeartbeatAck { seq })),
        (
            any::<u64>(),
            prop::collection::vec((workload_ref(), any::<Option<i32>>()), 0..6),
            prop::collection::vec(any::<u8>(), 0..64)
        )
            .prop_map(
                |(revision, workloads, manifest_json)| HubMessage::DesiredState(DesiredState {
                    revision,
                    workloads: workloads
                        .into_iter()
                        .map(|(workload, replicas)| WorkloadReplicas {
                            workload,
                            replicas,
                            owner: "ns/dso".into()
                        })
                        .collect(),
                    create_jobs: vec![JobCreate {
                        namespace: "ns".into(),
                        name: "dsj-abc".into(),
                        owner: "ns/dsj".into(),
                        manifest_json
                    }],
                    delete_jobs: vec![JobDelete {
                        namespace: "ns".into(),
                        name: "dsj-old".into(),
                        owner: "ns/dsj".into(),
                        propagation: Propagation::Foreground
                    }],
                })
            ),
        prop::collection::vec(scrape_target(), 0..5)
            .prop_map(|targets| HubMessage::Scrape(ScrapeTargets { targets })),
    ]
}

fn refusal_code() -> impl Strategy<Value = EnrollRefusalCode> {
    prop::sample::select(vec![
        EnrollRefusalCode::MalformedToken,
        EnrollRefusalCode::TokenNotFound,
        EnrollRefusalCode::WrongToken,
        EnrollRefusalCode::TokenExpired,
        EnrollRefusalCode::TokenAlreadyUsed,
        EnrollRefusalCode::UnknownMember,
        EnrollRefusalCode::BadCsr,
        EnrollRefusalCode::NameMismatch,
        EnrollRefusalCode::Superseded,
        EnrollRefusalCode::UnsupportedVersion,
        EnrollRefusalCode::Unavailable,
    ])
}

fn enroll_response() -> impl Strategy<Value = EnrollResponse> {
    prop_oneof![
        (".{0,200}", ".{0,200}", any::<i64>()).prop_map(|(cert_pem, ca_pem, not_after_unix_ms)| {
            EnrollResponse::Issued(IssuedCertificate {
                cert_pem,
                ca_pem,
                not_after_unix_ms,
            })
        }),
        (refusal_code(), ".{0,80}").prop_map(|(code, message)| {
            EnrollResponse::Refused(EnrollRefusal { code, message })
        }),
    ]
}

proptest! {
    /// Enrollment and renewal messages round-trip.
    #[test]
    fn enrollment_messages_round_trip(
        token in ".{0,100}",
        csr_der in prop::collection::vec(any::<u8>(), 0..512),
        response in enroll_response(),
    ) {
        let request = EnrollRequest { protocol_version: PROTOCOL_VERSION, token, csr_der: csr_der.clone() };
        prop_assert_eq!(decode::<EnrollRequest>(&encode(&request).unwrap()).unwrap(), request);
        let renew = AgentMessage::Renew(RenewRequest { csr_der });
        prop_assert_eq!(decode::<AgentMessage>(&encode(&renew).unwrap()).unwrap(), renew);
        let renewed = HubMessage::Renewed(response.clone());
        prop_assert_eq!(decode::<HubMessage>(&encode(&renewed).unwrap()).unwrap(), renewed);
        prop_assert_eq!(decode::<EnrollResponse>(&encode(&response).unwrap()).unwrap(), response);
    }

    /// Arbitrary bytes never panic the enrollment decoders (the hub reads them from clients
    /// without a certificate).
    #[test]
    fn decoding_enrollment_garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let _ = decode::<EnrollRequest>(&bytes);
        let _ = decode::<EnrollResponse>(&bytes);
    }

    #[test]
    fn agent_messages_round_trip(message in agent_message()) {
        let frame = encode(&message).unwrap();
        prop_assert_eq!(decode::<AgentMessage>(&frame).unwrap(), message);
    }

    #[test]
    fn hub_messages_round_trip(message in hub_message()) {
        let frame = encode(&message).unwrap();
        prop_assert_eq!(decode::<HubMessage>(&frame).unwrap(), message);
    }

    /// Arbitrary bytes never panic the decoder of either direction.
    #[test]
    fn decoding_garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let _ = decode::<AgentMessage>(&bytes);
        let _ = decode::<HubMessage>(&bytes);
    }

    /// Corrupting one byte of a valid frame gives either an error or a valid message, never a panic.
    #[test]
    fn corrupted_frames_never_panic(message in hub_message(), index in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let mut frame = encode(&message).unwrap().to_vec();
        let i = index.index(frame.len());
        frame[i] = byte;
        let _ = decode::<HubMessage>(&frame);
    }

    /// The framed stream survives arbitrary byte streams: every read ends in a message, an
    /// error or a clean end, never a panic or a hang.
    #[test]
    fn framed_stream_survives_garbage(bytes in prop::collection::vec(any::<u8>(), 0..4096)) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let mut stream: FramedStream<_, _, AgentMessage, HubMessage> =
                FramedStream::with_max_frame(&bytes[..], tokio::io::sink(), 1024);
            for _ in 0..bytes.len() + 1 {
                match stream.recv().await {
                    Ok(Some(_)) => continue,
                    Ok(None) | Err(_) => break,
                }
            }
        });
    }
}

#[test]
fn trailing_bytes_are_rejected() {
    let mut frame = encode(&HubMessage::HeartbeatAck(HeartbeatAck { seq: 7 }))
        .unwrap()
        .to_vec();
    frame.push(0);
    assert!(matches!(
        decode::<HubMessage>(&frame),
        Err(Error::TrailingBytes(1))
    ));
}

#[test]
fn unknown_variant_is_a_decode_error() {
    // Variant index 200 does not exist in either enum.
    assert!(matches!(
        decode::<AgentMessage>(&[200, 1]),
        Err(Error::Decode(_))
    ));
    assert!(matches!(
        decode::<HubMessage>(&[200]),
        Err(Error::Decode(_))
    ));
}

#[test]
fn oversized_messages_are_not_encoded() {
    let huge = DesiredState {
        revision: 1,
        create_jobs: vec![JobCreate {
            namespace: "ns".into(),
            name: "j".into(),
            owner: "ns/dsj".into(),
            manifest_json: vec![b'x'; MAX_FRAME_BYTES + 1],
        }],
        ..Default::default()
    };
    let err = encode(&HubMessage::DesiredState(huge)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::FrameTooLarge {
                max: MAX_FRAME_BYTES,
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn oversized_frame_prefix_is_refused_before_buffering() {
    // A prefix announcing 1 GiB; the reader must refuse it without waiting for the body.
    let bytes = (1u32 << 30).to_be_bytes();
    let mut stream: FramedStream<_, _, AgentMessage, HubMessage> =
        FramedStream::new(&bytes[..], tokio::io::sink());
    let err = stream.recv().await.unwrap_err();
    assert!(
        matches!(err, Error::FrameTooLarge { size: Some(size), max } if size == 1 << 30 && max == MAX_FRAME_BYTES),
        "{err}"
    );
    assert!(err.to_string().contains("exceeds"), "{err}");
}

/// A frame whose header and body arrive in separate reads decodes normally, and the frame
/// after it too (the codec must not mistake body bytes for a length prefix).
#[tokio::test]
async fn frames_split_across_reads_decode() {
    use tokio::io::AsyncWriteExt;
    let first = AgentMessage::Heartbeat(Heartbeat {
        seq: 1,
        sent_unix_ms: -1,
    });
    let second = AgentMessage::Heartbeat(Heartbeat {
        seq: u64::MAX,
        sent_unix_ms: i64::MAX,
    });
    let mut wire = Vec::new();
    for message in [&first, &second] {
        let payload = encode(message).unwrap();
        wire.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        wire.extend_from_slice(&payload);
    }
    let (reader, mut writer) = tokio::io::duplex(1024);
    let mut stream: FramedStream<_, _, AgentMessage, HubMessage> =
        FramedStream::new(reader, tokio::io::sink());
    let feeder = tokio::spawn(async move {
        for chunk in wire.chunks(3) {
            writer.write_all(chunk).await.unwrap();
            writer.flush().await.unwrap();
            tokio::task::yield_now().await;
        }
    });
    assert_eq!(stream.recv().await.unwrap(), Some(first));
    assert_eq!(stream.recv().await.unwrap(), Some(second));
    feeder.await.unwrap();
    assert_eq!(stream.recv().await.unwrap(), None);
}

#[tokio::test]
async fn truncated_frame_is_an_error_and_clean_end_is_none() {
    let payload = encode(&AgentMessage::Heartbeat(Heartbeat {
        seq: 1,
        sent_unix_ms: 0,
    }))
    .unwrap();
    let mut wire = (payload.len() as u32).to_be_bytes().to_vec();
    wire.extend_from_slice(&payload);

    let mut whole: FramedStream<_, _, AgentMessage, HubMessage> =
        FramedStream::new(&wire[..], tokio::io::sink());
    assert!(matches!(
        whole.recv().await,
        Ok(Some(AgentMessage::Heartbeat(Heartbeat { seq: 1, .. })))
    ));
    assert!(matches!(whole.recv().await, Ok(None)));

    for cut in [wire.len() - 1, 4, 2] {
        let mut truncated: FramedStream<_, _, AgentMessage, HubMessage> =
            FramedStream::new(&wire[..cut], tokio::io::sink());
        assert!(
            matches!(truncated.recv().await, Err(Error::Truncated)),
            "cut at {cut}"
        );
    }
}

#[tokio::test]
async fn messages_flow_both_ways_over_a_duplex_pipe() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let (ar, aw) = tokio::io::split(a);
    let (br, bw) = tokio::io::split(b);
    let mut agent: FramedStream<_, _, HubMessage, AgentMessage> = FramedStream::new(ar, aw);
    let mut hub: FramedStream<_, _, AgentMessage, HubMessage> = FramedStream::new(br, bw);

    let hello = AgentMessage::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        agent_version: "0.1.0".into(),
        kubernetes_version: "v1.33.0".into(),
        last_applied_revision: 0,
        namespaces: vec!["default".into()],
    });
    agent.send(&hello).await.unwrap();
    assert_eq!(hub.recv().await.unwrap(), Some(hello));

    let ack = HubMessage::HeartbeatAck(HeartbeatAck { seq: 9 });
    hub.send(&ack).await.unwrap();
    assert_eq!(agent.recv().await.unwrap(), Some(ack));

    agent.finish().await.unwrap();
    assert_eq!(hub.recv().await.unwrap(), None);
}

#[test]
fn version_support_window() {
    assert!(is_supported_version(PROTOCOL_VERSION));
    assert!(!is_supported_version(PROTOCOL_VERSION + 1));
    assert!(!is_supported_version(0));
}
