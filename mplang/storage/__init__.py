"""A party's own inputs: files in its data root (`data_root`) and tensors its owner
uploaded to its worker (`named_objects`)."""
