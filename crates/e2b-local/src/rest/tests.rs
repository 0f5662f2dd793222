use super::*;

#[test]
fn metadata_filter_is_double_decoded() {
    // What SDK 2.63 sends for {"scope": "a b/c"}: after the query layer decoded
    // `scope%3Da%252520b%252Fc` once, the value is `scope=a%2520b%2Fc`.
    let pairs = query_pairs("metadata=scope%3Da%252520b%252Fc&state=running%2Cpaused&limit=50");
    assert_eq!(
        pairs[0],
        ("metadata".to_owned(), "scope=a%2520b%2Fc".to_owned())
    );
    let filter = parse_metadata_filter(&pairs[0].1).unwrap();
    assert_eq!(filter, vec![("scope".to_owned(), "a b/c".to_owned())]);
    let q = parse_list_query(
        ApiVersion::V2,
        "metadata=scope%3Da%252520b%252Fc&state=running%2Cpaused&limit=50",
    )
    .unwrap();
    assert_eq!(q.limit, 50);
    assert_eq!(q.states, vec![SbState::Running, SbState::Paused]);
}

#[test]
fn metadata_filter_with_two_keys_and_bad_pairs() {
    let filter = parse_metadata_filter("a%3D1%26b%3Dx%2520y").unwrap();
    assert_eq!(
        filter,
        vec![("a".into(), "1".into()), ("b".into(), "x y".into())]
    );
    assert_eq!(
        parse_metadata_filter("a=1=2").unwrap_err().status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        parse_metadata_filter("justkey").unwrap_err().status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        parse_metadata_filter("%zz").unwrap_err().status,
        StatusCode::BAD_REQUEST
    );
}

#[test]
fn list_query_validation() {
    assert!(parse_list_query(ApiVersion::V2, "limit=0").is_err());
    assert!(parse_list_query(ApiVersion::V2, "limit=101").is_err());
    assert!(parse_list_query(ApiVersion::V2, "order=sideways").is_err());
    assert!(parse_list_query(ApiVersion::V2, "state=dead").is_err());
    assert!(parse_list_query(ApiVersion::V2, "nextToken=%21%21").is_err());
    let q = parse_list_query(ApiVersion::V2, "").unwrap();
    assert_eq!(q.states, vec![SbState::Running, SbState::Paused]);
    assert_eq!(q.limit, 100);
    let q = parse_list_query(ApiVersion::V1, "").unwrap();
    assert_eq!(q.states, vec![SbState::Running]);
}
