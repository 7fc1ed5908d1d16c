

/data/train-*.tfrecord   *image
label""	ÍÌL?*N0€@